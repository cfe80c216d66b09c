"""Forms of the intermediate action pages."""

from __future__ import annotations

import json
from typing import Any

from django import forms


class ReasonForm(forms.Form):
    """The confirmation of a destructive action, with an optional note for the event log."""

    note = forms.CharField(
        required=False,
        max_length=1_000,
        label="Reason (optional)",
        widget=forms.TextInput(attrs={"size": 70, "placeholder": "why (kept in the event log)"}),
        help_text="Recorded in the event payload as “admin: <your username>: <reason>”.",
    )


class ResumeForm(forms.Form):
    """Resume paused tasks, optionally replacing their input (``resume_task(input=...)``)."""

    replace_input = forms.BooleanField(
        required=False,
        label="Replace the input",
        help_text="When ticked, every selected task gets the JSON below as its new input.",
    )
    input = forms.CharField(
        required=False,
        label="New input (JSON)",
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "class": "pmcp-json-input"}),
        help_text='Any JSON value, e.g. {"answer": "approved"}; null clears the input.',
    )

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        if cleaned.get("replace_input"):
            text = (cleaned.get("input") or "").strip()
            if not text:
                self.add_error("input", "Enter a JSON value (null for no input).")
            else:
                try:
                    cleaned["input_value"] = json.loads(text)
                except ValueError as exc:
                    self.add_error("input", f"Not valid JSON: {exc}.")
        return cleaned
