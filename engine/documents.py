"""Parsing a bundle's structured documents, one way for everything that reads them
(signature digests and data loading alike).

YAML is read as the JSON it stands for: aliases are refused (a few hundred bytes of
nested aliases expand exponentially, and bundle files are parsed before their
signature is trusted) and dates stay strings, as they do when OPA reads a bundle.
"""

from __future__ import annotations

from typing import Any, ClassVar

import yaml

_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class _JsonLikeLoader(yaml.SafeLoader):
    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, Any]]]] = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _TIMESTAMP] for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "YAML aliases are not allowed in bundle documents", self.peek_event().start_mark)
        return super().compose_node(parent, index)


def load_yaml(content: bytes | str) -> Any:
    return yaml.load(content, Loader=_JsonLikeLoader)
