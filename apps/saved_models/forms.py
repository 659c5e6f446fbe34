from django import forms

from .models import MAX_NOTE, ModelAlias


class SaveModelForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="letters, digits, '.', '_' and '-'; a run names it as "
                                                     "model.path: models/NAME")
    # The length is services.save_model's check, as the API's; the box only stops typing past it.
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "maxlength": MAX_NOTE}),
                           help_text="what it is, for whoever trains from it")


class RenameForm(forms.Form):
    # The checks are services.name_problem's (the API's too); the box only stops typing past 100.
    name = forms.CharField(max_length=100, required=False, label="New name",
                           help_text="runs that load it by name while queued, training, stopped or failed block a "
                                     "rename; finished ones stay listed under it")


class AliasForm(forms.Form):
    alias = forms.CharField(max_length=ModelAlias.MAX_NAME, required=False,
                            help_text="champion, challenger: one of its saver's models carries each; setting it "
                                      "here moves it from another")
