// An MCP server built with the official TypeScript SDK (@modelcontextprotocol/sdk), for
// localllm's interop tests. MCP_SDK_DIR names the installed SDK package directory
// (.../node_modules/@modelcontextprotocol/sdk): ES modules ignore NODE_PATH.
//
//   node ts_server.mjs stdio
//   node ts_server.mjs http PORT [404|400]   (the status answered for an unknown session)
//
// Over HTTP it binds 127.0.0.1:PORT and prints "listening PORT" once bound.
//   POST/GET/DELETE /mcp    the SDK's StreamableHTTPServerTransport, one per session,
//                           with an event store (resumability: priming events, ids)
//   any     /redirect/mcp   307 to /mcp (same origin)
//   any     /away/mcp       307 to http://localhost:PORT/mcp (another origin)
//
// The low-level SDK Server with one tool, "ask", taking the AskRequest as arguments; the
// prompt picks the behaviour:
//   text        text content only: a JSON submission {"answer": "text"}
//   toolerror   isError with "the tool exploded"
//   ping        sends ping to the client during the call, answers {"pinged": true} when it returns
//   elicit      sends elicitation/create; answers {"action": <the client's action>}
//   (anything)  structuredContent {"echo", "call_id"} plus the same as text
import http from "node:http";
import { randomUUID } from "node:crypto";
const SDK = `${process.env.MCP_SDK_DIR}/dist/esm`;
const { Server } = await import(`${SDK}/server/index.js`);
const { StdioServerTransport } = await import(`${SDK}/server/stdio.js`);
const { StreamableHTTPServerTransport } = await import(`${SDK}/server/streamableHttp.js`);
const {
  CallToolRequestSchema, ListToolsRequestSchema, EmptyResultSchema, ElicitResultSchema,
} = await import(`${SDK}/types.js`);

function build() {
  const server = new Server({ name: "localllm-ts-test", version: "1.0.0" }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: [{ name: "ask", description: "Answer an AskRequest", inputSchema: { type: "object" } }],
  }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const args = request.params.arguments ?? {};
    const prompt = String(args.prompt ?? "");
    const text = (value) => ({ content: [{ type: "text", text: JSON.stringify(value) }] });
    if (request.params.name !== "ask") throw new Error(`unknown tool ${request.params.name}`);
    if (prompt === "text") return text({ answer: "text" });
    if (prompt === "toolerror") return { content: [{ type: "text", text: "the tool exploded" }], isError: true };
    if (prompt === "ping") {
      await extra.sendRequest({ method: "ping" }, EmptyResultSchema);
      return text({ pinged: true });
    }
    if (prompt === "elicit") {
      const answer = await extra.sendRequest({
        method: "elicitation/create",
        params: { message: "Your name?", requestedSchema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] } },
      }, ElicitResultSchema);
      return text({ action: answer.action });
    }
    const echo = { echo: prompt, call_id: String(args.call_id ?? "") };
    return { ...text(echo), structuredContent: echo };
  });
  return server;
}

class Events {
  constructor() { this.events = []; }
  async storeEvent(streamId, message) {
    const id = `${streamId}_${this.events.length}`;
    this.events.push({ id, streamId, message });
    return id;
  }
  async getStreamIdForEventId(id) { return this.events.find((e) => e.id === id)?.streamId; }
  async replayEventsAfter(lastEventId, { send }) {
    const at = this.events.findIndex((e) => e.id === lastEventId);
    if (at < 0) return "";
    const streamId = this.events[at].streamId;
    for (const e of this.events.slice(at + 1)) if (e.streamId === streamId) await send(e.id, e.message);
    return streamId;
  }
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : undefined;
}

async function serveHttp(port, unknownStatus) {
  const transports = new Map();
  const httpServer = http.createServer(async (req, res) => {
    const url = new URL(req.url, `http://${req.headers.host}`);
    if (url.pathname === "/redirect/mcp") {
      res.writeHead(307, { location: "/mcp" }).end();
      return;
    }
    if (url.pathname === "/away/mcp") {
      res.writeHead(307, { location: `http://localhost:${httpServer.address().port}/mcp` }).end();
      return;
    }
    if (url.pathname !== "/mcp") { res.writeHead(404).end("not found"); return; }
    try {
      const body = req.method === "POST" ? await readBody(req) : undefined;
      const sid = req.headers["mcp-session-id"];
      let transport = sid ? transports.get(sid) : undefined;
      if (!transport) {
        if (sid || !(body && body.method === "initialize")) {
          res.writeHead(unknownStatus, { "content-type": "application/json" }).end(JSON.stringify({
            jsonrpc: "2.0", id: null,
            error: { code: -32000, message: sid ? "Session not found" : "Bad Request: No valid session ID provided" },
          }));
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          eventStore: new Events(),
          onsessioninitialized: (id) => transports.set(id, transport),
        });
        transport.onclose = () => { if (transport.sessionId) transports.delete(transport.sessionId); };
        await build().connect(transport);
      }
      await transport.handleRequest(req, res, body);
    } catch (err) {
      if (!res.headersSent) res.writeHead(500).end(String(err));
    }
  });
  httpServer.listen(port, "127.0.0.1", () => console.log(`listening ${httpServer.address().port}`));
}

const [mode, port, unknown] = process.argv.slice(2);
if (mode === "stdio") {
  await build().connect(new StdioServerTransport());
} else {
  await serveHttp(Number(port ?? 0), Number(unknown ?? 404));
}
