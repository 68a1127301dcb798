"""The reference connectors, against respx mocks shaped like each provider's documentation."""
