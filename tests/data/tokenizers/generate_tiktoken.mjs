// Writes kimi-tiktoken.json: the ids and decoded texts of Kimi's tiktoken tokenizer (the
// tiny-kimi-k25 test model's tiktoken.model and tokenizer_config.json) from OpenAI's tiktoken
// (Rust, compiled to WebAssembly in the npm package `tiktoken`). Run once, by hand, from a
// scratch directory with the package installed (never inside the repository):
//   mkdir /tmp/tiknpm && cd /tmp/tiknpm && npm install tiktoken@1.0.22
//   node /path/to/kvrt/tests/data/tokenizers/generate_tiktoken.mjs
// It reads corpus.json here, plus the Kimi-specific texts below, and
// ../shared/models/tiny-kimi-k25 beside the repository.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modelDir = path.resolve(here, '../../../../shared/models/tiny-kimi-k25');
const require = createRequire(path.join(process.cwd(), 'package.json'));
const { Tiktoken } = require('tiktoken');
// The package exports no package.json: read the installed copy's.
const tiktokenVersion = JSON.parse(fs.readFileSync(
  path.join(process.cwd(), 'node_modules/tiktoken/package.json'), 'utf8')).version;

// Kimi's split pattern (TikTokenTokenizer.pat_str of Kimi's tokenization_kimi.py), as tiktoken
// runs it: Rust regex under fancy-regex, where [A&&[^B]] is a class intersection and a bare
// \p{Han} is Script=Han.
const patStr = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join('|');

// Specials as Kimi's tokenizer builds them: num_reserved_special_tokens = 256 ids after the
// ranks, each named by tokenizer_config.json's added_tokens_decoder, else <|reserved_token_{id}|>.
const ranksText = fs.readFileSync(path.join(modelDir, 'tiktoken.model'), 'utf8');
const numRanks = ranksText.split('\n').filter((line) => line.length > 0).length;
const config = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
const specials = {};
for (let id = numRanks; id < numRanks + 256; ++id) {
  const named = config.added_tokens_decoder[String(id)];
  specials[named ? named.content : `<|reserved_token_${id}|>`] = id;
}
const enc = new Tiktoken(ranksText, specials, patStr);

// Kimi's encode() first cuts runs of more than 25,000 whitespace (Python's str.isspace) or
// non-whitespace characters, and texts into 400,000-character chunks; then each part is
// encoded with allowed_special="all".
const pySpace = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0,
  0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
  0x2028, 0x2029, 0x202f, 0x205f, 0x3000]);
function kimiParts(text) {
  const chars = Array.from(text);
  const parts = [];
  for (let c = 0; c < chars.length || c === 0; c += 400000) {
    const s = chars.slice(c, c + 400000);
    let runLength = 0;
    let runIsSpace = s.length > 0 && pySpace.has(s[0].codePointAt(0));
    let start = 0;
    for (let i = 0; i < s.length; ++i) {
      const isSpace = pySpace.has(s[i].codePointAt(0));
      if (runIsSpace !== isSpace) {
        runLength = 1;
        runIsSpace = isSpace;
      } else if (++runLength > 25000) {
        parts.push(s.slice(start, i).join(''));
        start = i;
        runLength = 1;
      }
    }
    parts.push(s.slice(start).join(''));
  }
  return parts;
}
const encode = (text) => kimiParts(text).flatMap((part) => Array.from(enc.encode(part, 'all')));

// Decoding: the bytes of each id (a special's name unless skipped) read as UTF-8 with U+FFFD for
// invalid sequences, as Kimi's decode (tiktoken's decode, errors="replace") does.
const specialIds = new Set(Object.values(specials));
const utf8 = new TextDecoder('utf-8', { fatal: false });
const decode = (ids, skip) => {
  const kept = skip ? ids.filter((id) => !specialIds.has(id)) : ids;
  return utf8.decode(enc.decode(Uint32Array.from(kept)));
};

const corpus = JSON.parse(fs.readFileSync(path.join(here, 'corpus.json'), 'utf8'));
const kimiTexts = [
  'a中', '我、', '我、你。他！', 'Hello世界', '中文English混合', 'ab中cd文ef', 'Ａ中ｂ', '漢字かなカナ한글',
  '日本語の文章と、中国語の文章。', '1 12 123 1234 12345 123456 1234567', '第1章第12节第123页',
  "I'm 中's", '<|im_end|>', '[BOS]', 'text [BOS] inside[EOS]and after',
  '<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>你好<|im_end|>' +
    '<|im_assistant|>assistant<|im_middle|><think></think>Hi!',
  '<|reserved_token_100300|> and <|reserved_token_100261|>', '[PAD][UNK][EOT]',
  '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>',
  '<|im_end| <|im_end [BOS [EOS]]', '<|im_start|>not a Kimi special<|endoftext|>',
  ' '.repeat(40) + 'x', '\r\n\r\n  \r\n\t \r\n', 'emoji 🙂🙂🙂 and 🧑‍🚀',
];
// Runs longer than Kimi's 25,000-character limit, which encode() cuts (the ids differ from an
// uncut encode): kept in the fixture as [string, count] repeats.
const longTexts = [[['=', 25010], [' and', 1], [' ', 25010], ['x', 1]]];
const texts = [...corpus, ...kimiTexts, ...longTexts];
const expand = (repeats) => repeats.map(([s, n]) => s.repeat(n)).join('');

const REPLACEMENT = '\uFFFD';
const encodeCases = [];
const decodeCases = [];
for (const entry of texts) {
  const text = typeof entry === 'string' ? entry : expand(entry);
  const ids = encode(text);
  // Kimi's tokenizer adds nothing around a text (no BOS): transformers' encode with
  // add_special_tokens=True goes through PreTrainedTokenizer, whose
  // build_inputs_with_special_tokens Kimi does not override.
  const textField = typeof entry === 'string' ? { text } : { text_repeats: entry };
  encodeCases.push({ ...textField, ids, ids_with_special: ids });
  if (ids.length === 0) continue;
  const want = decode(ids, false);
  if (want !== text) throw new Error(`${JSON.stringify(text)} does not round-trip`);
  if (typeof entry !== 'string') {
    const uncut = Array.from(enc.encode(text, 'all'));
    if (JSON.stringify(uncut) === JSON.stringify(ids)) throw new Error('the cut changes nothing');
    continue;  // the round trip above is enough
  }
  decodeCases.push({ ids, skip_special_tokens: false, text: want });
  decodeCases.push({ ids, skip_special_tokens: true, text: decode(ids, true) });
  // Prefixes that end inside a multi-byte character: U+FFFD.
  let split = 0;
  for (let k = 1; k < ids.length && split < 3; ++k) {
    const prefix = ids.slice(0, k);
    const got = decode(prefix, true);
    if (got.includes(REPLACEMENT) && !text.includes(REPLACEMENT)) {
      decodeCases.push({ ids: prefix, skip_special_tokens: true, text: got });
      split++;
    }
  }
}
// An id past the vocabulary decodes to nothing (tiktoken itself would fail on it).
decodeCases.push({ ids: [numRanks + 256 + 5, ...encodeCases[1].ids], skip_special_tokens: true,
  text: decode(encodeCases[1].ids, true) });

// The pattern's two PCRE2 pitfalls (README of tiny-kimi-k25), which cl100k's ranks do not show:
// a small vocabulary (the 256 bytes, then the merges below) where "a中" and "我、" are single
// tokens, so the ids change if the split keeps "a中" together (no class intersection) or "我、"
// together (\p{Han} read as Script_Extensions, where "、" is Han).
const hex = (s) => Buffer.from(s, 'utf8');
const syntheticTokens = [...Array(256).keys()].map((b) => Buffer.from([b]));
for (const t of [[0xe4, 0xb8], '中', 'a中', [0xe6, 0x88], '我', [0xe3, 0x80], '、', '我、']) {
  syntheticTokens.push(typeof t === 'string' ? hex(t) : Buffer.from(t));
}
const syntheticRanks =
  syntheticTokens.map((bytes, rank) => `${bytes.toString('base64')} ${rank}\n`).join('');
const syntheticSpecials = {};
for (let k = 0; k < 256; ++k) {
  syntheticSpecials[`<|reserved_token_${syntheticTokens.length + k}|>`] = syntheticTokens.length + k;
}
const synthetic = new Tiktoken(syntheticRanks, syntheticSpecials, patStr);
const variants = {
  'no intersection': patStr.replaceAll('&&[^\\p{Han}]', ''),
  'Script_Extensions': patStr.replaceAll('\\p{Han}', '\\p{scx=Han}'),
};
const syntheticCases = [];
for (const text of ['a中', '我、', 'xa中我、y', 'Ab中文、abc']) {
  const ids = Array.from(synthetic.encode(text, 'all'));
  syntheticCases.push({ text, ids });
  for (const [name, pattern] of Object.entries(variants)) {
    const other = Array.from(new Tiktoken(syntheticRanks, syntheticSpecials, pattern).encode(text, 'all'));
    console.log(`synthetic ${JSON.stringify(text)}: ${ids} (${name}: ${other})`);
  }
}

const fixture = {
  tokenizer: 'kimi-tiktoken',
  tokenizer_files: '../shared/models/tiny-kimi-k25',
  generated_by: `generate_tiktoken.mjs: ids and text from OpenAI tiktoken (Rust, npm tiktoken ` +
                `${tiktokenVersion}) with Kimi's pat_str and specials; texts cut as Kimi's ` +
                `encode() cuts them (runs over 25,000 characters); ids_with_special: no BOS, as ` +
                `transformers runs Kimi's TikTokenTokenizer`,
  pat_str: patStr,
  encode: encodeCases,
  decode: decodeCases,
  synthetic: { tiktoken_model: syntheticRanks, encode: syntheticCases },
};
fs.writeFileSync(path.join(here, 'kimi-tiktoken.json'), JSON.stringify(fixture) + '\n');
console.log(`kimi-tiktoken: ${encodeCases.length} texts, ${decodeCases.length} decodes`);
