"""Components by name: a config names a component; adding one is a new function and a decorator."""


class Registry:
    def __init__(self, kind: str):
        self.kind = kind  # what the entries are, for error messages: "advantage fn", "reward fn"
        self._entries = {}

    def register(self, name: str):
        def add(obj):
            if name in self._entries:
                raise ValueError(f"duplicate {self.kind} '{name}'")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str):
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise KeyError(f"unknown {self.kind} '{name}'; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name) -> bool:
        try:
            return name in self._entries
        except TypeError:  # unhashable, e.g. a mapping where a name was expected
            return False

    def __iter__(self):
        return iter(self.names())
