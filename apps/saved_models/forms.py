from django import forms


class SaveModelForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="letters, digits, '.', '_' and '-'; a run names it as "
                                                     "model.path: models/NAME")
    note = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 3}),
                           help_text="what it is, for whoever trains from it")
