"""Which settings an edit form changed, judged against the values it showed when it was opened.

An edit form carries each value as it showed it, in hidden `shown_NAME` fields. Two people
editing one record at once then each change only what they touched: without it, the second to
save wrote back every value of the form they had opened, undoing the first one's changes unseen.
A value changed here that someone else changed since the form was opened is a conflict, refused
with both values named, so neither change is lost silently; the refused form is shown again with
the record as it is now and this user's changes over it, to be saved again knowingly.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from baseline.errors import Conflict

SHOWN_PREFIX = "shown_"


def _shown_values(form: Mapping[str, str]) -> dict[str, str] | None:
    """The values as the form showed them when it was opened; None from a client that does not
    send them (a script posting the form), for which every value it sends is a change."""
    shown = {
        name.removeprefix(SHOWN_PREFIX): value
        for name, value in form.items()
        if name.startswith(SHOWN_PREFIX)
    }
    return shown or None


def _same(a: str, b: str) -> bool:
    """Form values alike as a person reads them (a textarea sends its line ends as CRLF)."""
    return a.replace("\r\n", "\n").strip() == b.replace("\r\n", "\n").strip()


def touched_fields(form: Mapping[str, str], checkboxes: Collection[str] = ()) -> set[str]:
    """The names of the values this form's user changed from what it showed (every one it sent,
    from a client that does not send what it showed); what `changed_fields` checks."""
    sent = {name: form[name] for name in form if not name.startswith(SHOWN_PREFIX)}
    for box in checkboxes:
        sent.setdefault(box, "")
    shown = _shown_values(form)
    if shown is None:
        return set(sent)
    return {name for name in sent if name in shown and not _same(sent[name], shown[name])}


def form_again(
    form: Mapping[str, str], now: Mapping[str, str], checkboxes: Collection[str] = ()
) -> dict[str, str]:
    """The form to show again after a refused save: the record as it is now (`now`, to be
    carried as shown) with this form's changes over it. Saved again, it writes those changes,
    knowingly where someone else's were refused; with the values it first showed it would be
    refused again on every save, and a reload would lose what was typed."""
    typed = {name: form.get(name, "") for name in touched_fields(form, checkboxes) if name in now}
    return {**now, **typed}


def _setting_name(name: str) -> str:
    return name.replace("_", " ")


def changed_fields(
    form: Mapping[str, str],
    now: Mapping[str, str],
    checkboxes: Collection[str] = (),
    *,
    label: Callable[[str], str] = _setting_name,
    someone: str = "someone else",
    what_now: str = "the form shows the settings as they are now, with your changes over them; "
    "save again to keep yours",
) -> set[str]:
    """The names of the values this form changes: those it sent, less those left as shown.

    `now` is the record as the form would show it now; `checkboxes` are the form's boxes, which
    a browser leaves out when unticked (read as the empty value). A field the form did not send
    (a disabled one) is not a change. Raises Conflict when a value changed here was also changed
    by `someone` since the form was opened, naming each such value by its `label` and saying
    `what_now` (the refused form is shown again by `form_again`)."""
    touched = touched_fields(form, checkboxes)
    shown = _shown_values(form)
    if shown is None:
        return touched
    clashes = sorted(name for name in touched if not _same(now[name], shown[name]))
    if clashes:

        def reads(name: str) -> str:
            return now[name] or ("off" if name in checkboxes else "empty")

        now_reads = ", ".join(f"{label(name)} (now {reads(name)})" for name in clashes)
        raise Conflict(
            f"{now_reads}: changed by {someone} since you opened this form; nothing was "
            f"saved: {what_now}"
        )
    return touched
