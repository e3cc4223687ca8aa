"""Prompt integrity (seed §7): the team's merged policy as the plan carries it
(``policy``), untrusted-content boundaries (``spotlight``), judging scanner findings
(``injection``) and what the output guard looks for in answers (``output``). Pure
functions over strings; the scanner's rules and the tool-call verdicts are Rego in
the bundle, and the wire protocols are adapters."""
