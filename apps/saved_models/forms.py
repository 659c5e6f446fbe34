from django import forms

from .models import MAX_NOTE


class SaveModelForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="letters, digits, '.', '_' and '-'; a run names it as "
                                                     "model.path: models/NAME")
    # The length is services.save_model's check, as the API's; the box only stops typing past it.
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "maxlength": MAX_NOTE}),
                           help_text="what it is, for whoever trains from it")
