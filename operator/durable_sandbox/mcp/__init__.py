"""An MCP server exposing a Sandbox's calls as tools (`dsb mcp --sandbox NAME`, stdio): any MCP client (an IDE
assistant, an agent framework) uses a durable Sandbox through the call API (``durable_sandbox.client``)."""
