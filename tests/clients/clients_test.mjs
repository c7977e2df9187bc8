// Real clients against a running kvrt serve (stories260k; every compared call asks for greedy
// decoding, temperature 0, since a request that leaves it unset samples at 1): the npm openai
// package, the Vercel AI SDK (ai + @ai-sdk/openai's default provider, which speaks the Responses
// API, and its chat provider) and LangChain (@langchain/openai's ChatOpenAI, with and without
// the Responses API, and its completions LLM). Each call's answer is checked against what
// kvrt's own HTTP answer (fetch) gives for the same request.
//   usage: node clients_test.mjs <base url>        (exit status: the number of failures)
import OpenAI from "openai";
import { generateText, streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { ChatOpenAI, OpenAI as LangChainOpenAI } from "@langchain/openai";

const base = process.argv[2];
let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok: ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAILED: ${name}: ${e && e.stack ? e.stack : e}`);
  }
}
function expect(cond, what) {
  if (!cond) throw new Error(what);
}
async function post(path, body) {
  const r = await fetch(base + path, { method: "POST", body: JSON.stringify(body) });
  const text = await r.text();
  expect(r.status === 200, `${path}: HTTP ${r.status}: ${text}`);
  return JSON.parse(text);
}

const model = "stories260k";
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0 });
const prompt = "Once upon a time";
const messages = [{ role: "user", content: prompt }];
// What kvrt answers the same requests with, over plain HTTP.
const temperature = 0;
const completion = (await post("/v1/completions", { prompt, max_tokens: 12, temperature }))
  .choices[0].text;
const chatText = (await post("/v1/chat/completions", { messages, max_tokens: 12, temperature }))
  .choices[0].message.content;
const respText = (await post("/v1/responses", { input: prompt, max_output_tokens: 12, temperature }))
  .output[0].content[0].text;

await check("openai: completions", async () => {
  const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature });
  expect(r.choices[0].text === completion, JSON.stringify(r));
  expect(r.usage.completion_tokens === 12, JSON.stringify(r.usage));
});
await check("openai: chat, streamed, with usage", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  expect(text === chatText, `${JSON.stringify(text)} != ${JSON.stringify(chatText)}`);
  expect(usage && usage.completion_tokens === 12, JSON.stringify(usage));
});
await check("openai: completions logprobs", async () => {
  const r = await client.completions.create({ model, prompt, max_tokens: 6, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  expect(lp.tokens.length === 6 && lp.tokens.join("") === r.choices[0].text, JSON.stringify(lp));
  expect(lp.token_logprobs.every((x) => x <= 0), JSON.stringify(lp.token_logprobs));
});
await check("openai: chat logprobs", async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 6, logprobs: true, top_logprobs: 2,
  });
  const content = r.choices[0].logprobs.content;
  expect(content.length === 6, JSON.stringify(r.choices[0]));
  expect(content.every((c) => c.top_logprobs.length === 2 && c.logprob <= 0), "top_logprobs");
});
await check("openai: n = 2", async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 6, n: 2, temperature: 1, seed: 3,
  });
  expect(r.choices.length === 2 && r.choices[1].index === 1, JSON.stringify(r.choices));
});
await check("openai: responses, and streamed", async () => {
  const r = await client.responses.create({
    model, input: prompt, max_output_tokens: 12, temperature,
  });
  expect(r.output_text === respText, `${JSON.stringify(r.output_text)} != ${respText}`);
  const stream = await client.responses.create({
    model, input: prompt, max_output_tokens: 12, temperature, stream: true,
  });
  let text = "", done = null;
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") text += event.delta;
    if (event.type === "response.completed" || event.type === "response.incomplete") done = event;
  }
  expect(text === respText, `${JSON.stringify(text)} != ${JSON.stringify(respText)}`);
  expect(done && done.response.usage.output_tokens === 12, JSON.stringify(done));
});

const provider = createOpenAI({ baseURL: base + "/v1", apiKey: "none" });
await check("ai sdk: generateText (default provider: the Responses API)", async () => {
  const r = await generateText({
    model: provider(model), prompt, maxOutputTokens: 12, temperature, maxRetries: 0,
  });
  expect(r.text === respText, `${JSON.stringify(r.text)} != ${JSON.stringify(respText)}`);
  expect(r.usage.outputTokens === 12, JSON.stringify(r.usage));
});
await check("ai sdk: streamText", async () => {
  const r = streamText({
    model: provider(model), prompt, maxOutputTokens: 12, temperature, maxRetries: 0,
  });
  let text = "";
  for await (const part of r.textStream) text += part;
  expect(text === respText, `${JSON.stringify(text)} != ${JSON.stringify(respText)}`);
});
await check("ai sdk: chat provider", async () => {
  const r = await generateText({
    model: provider.chat(model), prompt, maxOutputTokens: 12, temperature, maxRetries: 0,
  });
  expect(r.text === chatText, `${JSON.stringify(r.text)} != ${JSON.stringify(chatText)}`);
});

const configuration = { baseURL: base + "/v1" };
await check("langchain: ChatOpenAI invoke and stream", async () => {
  const chat = new ChatOpenAI({
    model, apiKey: "none", configuration, maxTokens: 12, temperature, maxRetries: 0,
  });
  const r = await chat.invoke(prompt);
  expect(r.content === chatText, `${JSON.stringify(r.content)} != ${JSON.stringify(chatText)}`);
  let text = "";
  for await (const chunk of await chat.stream(prompt)) text += chunk.content;
  expect(text === chatText, `${JSON.stringify(text)} != ${JSON.stringify(chatText)}`);
});
await check("langchain: ChatOpenAI with logprobs", async () => {
  const chat = new ChatOpenAI({
    model, apiKey: "none", configuration, maxTokens: 6, logprobs: true, topLogprobs: 2, maxRetries: 0,
  });
  const r = await chat.invoke(prompt);
  expect(r.response_metadata.logprobs.content.length === 6, JSON.stringify(r.response_metadata));
});
await check("langchain: ChatOpenAI with n = 2", async () => {
  const chat = new ChatOpenAI({
    model, apiKey: "none", configuration, maxTokens: 6, n: 2, temperature: 1, maxRetries: 0,
  });
  const r = await chat.generate([[["human", prompt]]]);
  expect(r.generations[0].length === 2, JSON.stringify(r.generations));
});
await check("langchain: ChatOpenAI on the Responses API", async () => {
  const chat = new ChatOpenAI({
    model, apiKey: "none", configuration, maxTokens: 12, temperature, useResponsesApi: true,
    maxRetries: 0,
  });
  const r = await chat.invoke(prompt);
  expect(r.text === respText, `${JSON.stringify(r.text)} != ${JSON.stringify(respText)}`);
});
await check("langchain: completions with a list of prompts", async () => {
  const llm = new LangChainOpenAI({
    model, apiKey: "none", configuration, maxTokens: 12, temperature, maxRetries: 0,
  });
  const r = await llm.generate([prompt, prompt]);
  expect(r.generations.length === 2, JSON.stringify(r));
  expect(r.generations.every((g) => g[0].text === completion), JSON.stringify(r.generations));
});

process.exit(failed);
