"""The public contract's rules, each defined once.

* :mod:`.limits`: every input limit (lengths, ranges, JSON depth, list sizes);
* :mod:`.validation`: the checks the services run on every argument, whoever calls;
* :mod:`.arguments`: argument kinds that carry one rule to the services (``check``), the MCP
  tools' JSON Schemas (``schema``) and the HTTP API's serializers and OpenAPI schema (``drf``);
* :mod:`.shapes`: the one serialized shape of each object (run, task, claim, …), used by the
  API, the MCP server and the remote worker;
* :mod:`.protocol`: the methods every orchestrator offers, local or remote.

``limits``, ``validation`` and ``arguments`` import no models.
"""
