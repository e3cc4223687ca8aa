"""Translators: one module per (client protocol, provider protocol) pair, named
``<client>_to_<provider>``. Each is a pure conversion of the request, the response and
the stream; its docstring says what converts, what is dropped and what is refused."""
