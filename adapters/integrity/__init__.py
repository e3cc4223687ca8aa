"""Prompt integrity (seed §7) as a gateway step: the request side (policy prompt,
spotlighting, injection scanning) in ``guard``, the answer side (tool-call
allow-list, output guard) in ``answers``."""
