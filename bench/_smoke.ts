import { writeConfig, connectStdio } from "../test/helpers/server.js";
const t0 = performance.now();
const cfg = writeConfig();
const c = await connectStdio(cfg);
const tl = await c.client.listTools();
console.log("tools", tl.tools.map(t=>t.name).join(","), performance.now()-t0);
const st = await c.client.callTool({name:"get_runtime_status", arguments:{}});
console.log(JSON.stringify(st.structuredContent).slice(0,300), performance.now()-t0);
const l = await c.client.callTool({name:"load_model", arguments:{model:"all-minilm-l6-v2"}});
console.log(JSON.stringify(l.structuredContent ?? l.content).slice(0,400), performance.now()-t0);
for (let i=0;i<5;i++){ const a=performance.now(); const r = await c.client.callTool({name:"run_inference", arguments:{model:"all-minilm-l6-v2", texts:["hello world, this is a test sentence"]}}); console.log(performance.now()-a, JSON.stringify(r.structuredContent).slice(0,200)); }
await c.close();
