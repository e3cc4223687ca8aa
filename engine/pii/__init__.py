"""Personal data: finding it in text (``recognizers``), replacing it as the policy
says (``redaction``) and putting pseudonyms back in answers (``restore``). Pure
functions over strings; the vault, the NER model and the wire protocols are adapters."""
