"""Stateful stand-ins for the reference connectors' providers (GitHub, Procore, Microsoft Graph),
each answering as the provider's documentation says, served over real HTTP on 127.0.0.1 so that
worker processes can talk to them (``server.ProviderServer``)."""
