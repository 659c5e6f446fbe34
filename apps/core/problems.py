"""What was wrong with what someone sent, as one message: "Report not saved: name: ...; note: ...".

Django's own messages end with a period ("Enter a number.") and the project's do not ("at most
10,000 characters"), so a message that joined them and added its own period read "Enter a
number.." (the report forms).
"""
from collections.abc import Iterable


def sentence(problems: Iterable[str]) -> str:
    """`problems` joined by "; ", each without its own closing period, ending with one period."""
    return "; ".join(problem.strip().removesuffix(".") for problem in problems) + "."


def form_problems(form) -> list[str]:
    """Each of a bound form's errors as "field: message" ("message" for one of the whole form)."""
    return [message if name == "__all__" else f"{name}: {message}"
            for name, messages in form.errors.items() for message in messages]
