"""What a route asks of the gateway. Every operation runs the one pipeline
(authenticate · parse · decide · admission steps · dispatch); each step declares
the operations it applies to (``Step.operations``), so a new operation — another
protocol's token count — reuses the stages without the executor naming it twice."""

from __future__ import annotations

import enum


class Operation(enum.StrEnum):
    INFERENCE = "inference"  # a model's answer: reserved, guarded, priced and settled
    COUNT_TOKENS = "count_tokens"  # the input's size in the target's tokens: nothing generated, never billed
