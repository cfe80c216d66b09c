"""Serializers: ``inputs`` (request bodies, query strings) and ``outputs`` (responses) apart."""
