// Renders the reference outputs of kvrt's chat template test (tests/core/text/chat_template_test.cc)
// with Hugging Face's own engine, @huggingface/jinja, and writes them to fixtures.json beside this
// file. Run once when a template or a conversation is added; the test reads only fixtures.json.
//
//   npm install --prefix /tmp/hf-jinja @huggingface/jinja@0.5.13
//   HF_JINJA=/tmp/hf-jinja/node_modules/@huggingface/jinja/dist/index.js node generate.mjs
//
// Templates: templates.json (each with the place its text was taken from), and the three in
// ../shared/tokenizers and the two in ../shared/models (read from there; the test skips them when
// ../shared is absent). strftime_now sees a fixed time (NOW, UTC), which the test passes too.
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const { Template } = await import(process.env.HF_JINJA ?? "@huggingface/jinja");
const version = process.env.HF_JINJA_VERSION ?? "0.5.13";

const NOW = 1721952000; // 2024-07-26 00:00:00 UTC
process.env.TZ = "UTC";
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    super(...(args.length ? args : [NOW * 1000]));
  }
  static now() {
    return NOW * 1000;
  }
};

const conversations = {
  single_user: [{ role: "user", content: "Hello! Who are you?" }],
  system_user: [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "What is 2 + 2?" },
  ],
  multi_turn: [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello. How can I help?" },
    { role: "user", content: "Tell me a joke." },
  ],
  assistant_last: [
    { role: "user", content: "Name a colour." },
    { role: "assistant", content: "Blue." },
  ],
  no_system_multi: [
    { role: "user", content: "Hello, how are you?" },
    { role: "assistant", content: "I'm doing great. How can I help you today?" },
    { role: "user", content: "I'd like to show off how chat templating works!" },
  ],
  // Text a template may trim or escape: spaces around, newlines, quotes, non-ASCII, tags.
  awkward_text: [
    { role: "system", content: "  Réponds en français, s'il te plaît.\n" },
    { role: "user", content: "\"Quote\" {{ not a tag }} 日本語 🙂\ttab" },
    { role: "assistant", content: "   I am an assistant   " },
    { role: "user", content: "Another question\n\n" },
  ],
  // A reasoning model's earlier answer, as Qwen3 and DeepSeek-R1 templates split it.
  thinking: [
    { role: "user", content: "What is 3 * 7?" },
    { role: "assistant", content: "<think>\nMultiply.\n</think>\n\n21" },
    { role: "user", content: "And 3 * 8?" },
  ],
};

const templates = JSON.parse(fs.readFileSync(path.join(here, "templates.json"), "utf8"));
const shared = path.resolve(here, "../../../../shared");
for (const dir of ["tokenizers/deepseek-v3", "tokenizers/qwen3", "tokenizers/llama-3.1",
                   "models/tiny-qwen3", "models/tiny-llama3"]) {
  const config = JSON.parse(fs.readFileSync(path.join(shared, dir, "tokenizer_config.json"), "utf8"));
  const text = (t) => (t == null ? "" : typeof t === "string" ? t : t.content);
  templates.push({
    name: dir,
    shared: dir,
    template: config.chat_template,
    bos_token: text(config.bos_token),
    eos_token: text(config.eos_token),
  });
}

const fixtures = [];
for (const t of templates) {
  const template = new Template(t.template);
  const cases = [];
  for (const [name, messages] of Object.entries(conversations)) {
    for (const add_generation_prompt of [true, false]) {
      const context = { messages, add_generation_prompt, bos_token: t.bos_token, eos_token: t.eos_token };
      const c = { conversation: name, add_generation_prompt };
      try {
        c.expected = template.render(context);
      } catch (e) {
        c.error = String(e.message ?? e);
      }
      cases.push(c);
    }
  }
  const f = { name: t.name, bos_token: t.bos_token, eos_token: t.eos_token, cases };
  if (t.shared) {
    f.shared = t.shared; // the template is read from ../shared/<shared>/tokenizer_config.json
  } else {
    f.source = t.source;
    f.template = t.template;
  }
  fixtures.push(f);
}
const out = {
  generator: `tests/data/chat_templates/generate.mjs with @huggingface/jinja ${version}`,
  now_unix_seconds: NOW,
  conversations,
  fixtures,
};
fs.writeFileSync(path.join(here, "fixtures.json"), JSON.stringify(out, null, 1) + "\n");
console.log(`${fixtures.length} templates, ${fixtures.reduce((n, f) => n + f.cases.length, 0)} cases`);
