"""What a browser submits from a page's form, read from the page's HTML: the tests of edit forms
post exactly what a person who changed one field would."""

from __future__ import annotations

from html.parser import HTMLParser


class _Form(HTMLParser):
    """Every named input, textarea and selected option of the form posting to `action` (or of
    every form when None), as the page shows them; an unticked box, a radio group with nothing
    chosen and a disabled field are left out, as a browser leaves them out."""

    def __init__(self, action: str | None) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self._action = action
        self._inside = action is None
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {k: v or "" for k, v in attrs}
        if tag == "form" and self._action is not None:
            self._inside = named.get("action") == self._action
        if not self._inside:
            return
        if tag == "input" and named.get("name") and "disabled" not in named:
            if named.get("type") in ("checkbox", "radio"):
                if "checked" in named:
                    self.fields[named["name"]] = named.get("value") or "on"
            else:
                self.fields[named["name"]] = named.get("value", "")
        elif tag == "textarea":
            self._textarea = named.get("name")
            self.fields[str(self._textarea)] = ""
        elif tag == "select":
            self._select = named.get("name")
        elif tag == "option" and self._select and "selected" in named:
            self.fields[self._select] = named.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None
        elif tag == "form" and self._action is not None:
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._textarea and self._inside:
            self.fields[self._textarea] += data


def form_fields(page: str, action: str | None = None) -> dict[str, str]:
    """The fields the form posting to `action` on `page` submits unchanged."""
    form = _Form(action)
    form.feed(page)
    return form.fields
