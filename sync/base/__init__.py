"""What every part of the engine may use and which uses nothing of the engine: the abort signal,
test signals, durations and names as people write them, redaction of secrets, the credential
box, database URLs, the embedded Postgres, tracing."""
