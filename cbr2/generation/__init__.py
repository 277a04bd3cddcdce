"""What happens around the single LLM pass, beyond the paper: schema-constrained decoding
(``grammar``), argument canonicalisation (``canonicalize``) and the adaptive fallback
(``fallback``). All are off by default, which is the paper's single-pass setting."""
