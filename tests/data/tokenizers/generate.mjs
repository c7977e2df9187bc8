// Writes the tokenizer reference fixtures (<name>.json here) from transformers.js's tokenizers
// (@lenml/tokenizers) and cross-checks the ids with Hugging Face's Rust tokenizers compiled to
// WebAssembly (@mlc-ai/web-tokenizers). Run once, by hand, from a scratch directory with both
// packages installed (never inside the repository):
//   mkdir /tmp/tok && cd /tmp/tok && npm install @lenml/tokenizers@3.7.2 @mlc-ai/web-tokenizers@0.1.6
//   node /path/to/kvrt/tests/data/tokenizers/generate.mjs
// It reads corpus.json and the tokenizer files (../shared/tokenizers/<name>/ beside the
// repository; mistral/ here) and prints every place where the two references disagree.
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const shared = path.resolve(here, '../../../../shared/tokenizers');
const require = createRequire(path.join(process.cwd(), 'package.json'));
const { TokenizerLoader } = require('@lenml/tokenizers');
// The wasm package is a UMD bundle behind "type": "module": load a .cjs copy of it.
const mlcDir = path.dirname(require.resolve('@mlc-ai/web-tokenizers/package.json'));
const mlcCopy = path.join(os.tmpdir(), 'web-tokenizers-index.cjs');
fs.copyFileSync(path.join(mlcDir, 'lib/index.js'), mlcCopy);
const { Tokenizer: RustTokenizer } = require(mlcCopy);

const corpus = JSON.parse(fs.readFileSync(path.join(here, 'corpus.json'), 'utf8'));

// The SentencePiece-derived file as newer Mistral/Llama files write it: no normalizer, a
// Metaspace pre-tokenizer that prepends "▁" to the first piece only. The test applies the same
// overrides (the fixture's "overrides").
const metaspaceOverrides = {
  normalizer: null,
  pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
};

const tokenizers = [
  { name: 'qwen3', dir: path.join(shared, 'qwen3'), where: 'shared' },
  { name: 'llama-3.1', dir: path.join(shared, 'llama-3.1'), where: 'shared' },
  { name: 'deepseek-v3', dir: path.join(shared, 'deepseek-v3'), where: 'shared' },
  { name: 'mistral', dir: path.join(here, 'mistral'), where: 'repo' },
  { name: 'mistral-metaspace', dir: path.join(here, 'mistral'), where: 'repo',
    overrides: metaspaceOverrides },
];

// What Python transformers adds with add_special_tokens=True. LlamaTokenizerFast (and Gemma's,
// CodeLlama's) rebuild the post-processor from tokenizer_config.json's add_bos_token (default
// true) and add_eos_token (default false); other classes use tokenizer.json's post-processor,
// which transformers.js applies too.
const llamaClasses = ['LlamaTokenizer', 'LlamaTokenizerFast', 'CodeLlamaTokenizer',
  'CodeLlamaTokenizerFast', 'GemmaTokenizer', 'GemmaTokenizerFast'];
function pythonSpecialIds(tok, config, ids, jsWithSpecial) {
  if (!llamaClasses.includes(config.tokenizer_class)) return jsWithSpecial;
  const content = (t) => (t && typeof t === 'object' ? t.content : t);
  const out = [];
  if (config.add_bos_token ?? true) out.push(tok.model.tokens_to_ids.get(content(config.bos_token)));
  out.push(...ids);
  if (config.add_eos_token ?? false) out.push(tok.model.tokens_to_ids.get(content(config.eos_token)));
  return out;
}

const REPLACEMENT = '\uFFFD';

// transformers' clean_up_tokenization, which Python applies after the Rust decoder when
// tokenizer_config.json's clean_up_tokenization_spaces is true.
function cleanUp(text) {
  return text.replaceAll(' .', '.').replaceAll(' ?', '?').replaceAll(' !', '!')
    .replaceAll(' ,', ',').replaceAll(" ' ", "'").replaceAll(" n't", "n't")
    .replaceAll(" 'm", "'m").replaceAll(" 's", "'s").replaceAll(" 've", "'ve")
    .replaceAll(" 're", "'re");
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

for (const spec of tokenizers) {
  const jsonPath = path.join(spec.dir, 'tokenizer.json');
  if (!fs.existsSync(jsonPath)) {
    console.log(`${spec.name}: ${jsonPath} is missing, skipped`);
    continue;
  }
  const tokenizerJSON = { ...JSON.parse(fs.readFileSync(jsonPath, 'utf8')), ...spec.overrides };
  const tokenizerConfig =
    JSON.parse(fs.readFileSync(path.join(spec.dir, 'tokenizer_config.json'), 'utf8'));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const rust = await RustTokenizer.fromJSON(new TextEncoder().encode(JSON.stringify(tokenizerJSON)));
  const special = new Set(tokenizerJSON.added_tokens.filter((t) => t.special).map((t) => t.id));

  // The Rust library is what Python transformers runs: it is the expected value; where
  // transformers.js gives something else, the fixture keeps that too ("transformers_js").
  const rustDecode = (ids, skip) => {
    const kept = skip ? ids.filter((id) => !special.has(id)) : ids;
    const text = kept.length ? rust.decode(Int32Array.from(kept)) : '';
    return tokenizerConfig.clean_up_tokenization_spaces ? cleanUp(text) : text;
  };
  const jsDecode = (ids, skip) => (ids.length ? tok.decode(ids, { skip_special_tokens: skip }) : '');
  const encode = [];
  const decode = [];
  let disagreements = 0;
  const addDecode = (ids, skip) => {
    const entry = { ids, skip_special_tokens: skip, text: rustDecode(ids, skip) };
    const js = jsDecode(ids, skip);
    if (js !== entry.text) {
      entry.transformers_js = js;
      disagreements++;
      console.log(`${spec.name}: decode ${ids} (skip ${skip}): rust ${JSON.stringify(entry.text)}` +
                  ` transformers.js ${JSON.stringify(js)}`);
    }
    decode.push(entry);
    return entry.text;
  };
  for (const text of corpus) {
    const ids = Array.from(rust.encode(text));
    const jsIds = Array.from(tok.encode(text, { add_special_tokens: false }));
    const jsWithSpecial = Array.from(tok.encode(text, { add_special_tokens: true }));
    // TemplateProcessing's additions, as transformers.js applies them, around the Rust ids.
    let p = 0;
    while (!same(jsWithSpecial.slice(p, p + jsIds.length), jsIds)) p++;
    const templated = [...jsWithSpecial.slice(0, p), ...ids, ...jsWithSpecial.slice(p + jsIds.length)];
    const withSpecial = pythonSpecialIds(tok, tokenizerConfig, ids, templated);
    const entry = { text, ids, ids_with_special: withSpecial };
    if (!same(ids, jsIds)) {
      entry.transformers_js = jsIds;
      disagreements++;
      console.log(`${spec.name}: ids for ${JSON.stringify(text).slice(0, 60)}: rust ${ids.slice(0, 8)}` +
                  `... transformers.js ${jsIds.slice(0, 8)}...`);
    }
    encode.push(entry);
    if (withSpecial.length === 0) continue;
    addDecode(withSpecial, true);
    addDecode(withSpecial, false);
    // Prefixes that end inside a multi-byte character: the decoders' U+FFFD.
    let split = 0;
    for (let k = 1; k < ids.length && split < 3; ++k) {
      const prefix = ids.slice(0, k);
      if (rustDecode(prefix, true).includes(REPLACEMENT) && !text.includes(REPLACEMENT)) {
        addDecode(prefix, true);
        split++;
      }
    }
  }
  // An id past the vocabulary decodes to nothing.
  addDecode([rust.getVocabSize() + 5, ...encode[1].ids], true);

  const fixture = {
    tokenizer: spec.name,
    tokenizer_files: spec.where === 'shared' ? `../shared/tokenizers/${spec.name}`
                                             : 'tests/data/tokenizers/mistral',
    overrides: spec.overrides ?? {},
    generated_by: 'generate.mjs: ids and text from HF tokenizers (Rust, @mlc-ai/web-tokenizers ' +
                  '0.1.6), as Python transformers computes them; ids_with_special per Python ' +
                  'transformers (LlamaTokenizerFast: add_bos_token/add_eos_token); ' +
                  'transformers_js: what @lenml/tokenizers 3.7.2 gives where it differs',
    encode,
    decode,
  };
  fs.writeFileSync(path.join(here, `${spec.name}.json`), JSON.stringify(fixture) + '\n');
  console.log(`${spec.name}: ${encode.length} texts, ${decode.length} decodes, ` +
              `${disagreements} disagreements with transformers.js`);
}

// ---- Synthetic tokenizers: one small BPE model, and variants that each exercise constructs the
// real files above do not (every Split behaviour, Digits, normalizers, added-token options,
// decoders, post-processors, unknown and byte-fallback pieces). Their references come from the
// Rust library alone (transformers.js lacks some of these constructs).
{
  const byteChars = [];
  {
    let n = 0;
    for (let b = 0; b < 256; ++b) {
      const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      byteChars.push(String.fromCodePoint(printable ? b : 256 + n++));
    }
  }
  const vocab = {};
  const add = (t) => { if (!(t in vocab)) vocab[t] = Object.keys(vocab).length; };
  byteChars.forEach(add);
  ['\u2581', '<unk>', 'a', 'b'].forEach(add);
  for (let b = 0; b < 256; ++b) add(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
  const merges = [['Ġ', 't'], ['h', 'e'], ['Ġt', 'he'], ['i', 'n'], ['in', 'g'], ['e', 'r'],
    ['Ġ', 'a'], ['a', 'n'], ['an', 'd'], ['Ġ', 'and'], ['o', 'n'], ['1', '2'], ['12', '3'],
    ['\u2581', 't'], ['\u2581t', 'he'], ['\u2581', 'a'], ['t', 'h'], ['th', 'e'], ['a', 'b'],
    ['ab', 'ab']];
  for (const [a, b] of merges) add(a + b);
  const size = Object.keys(vocab).length;
  const added = [
    { id: size, content: '<s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
    { id: size + 1, content: '</s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
  ];
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  const base = {
    version: '1.0', truncation: null, padding: null, added_tokens: added,
    normalizer: null, pre_tokenizer: byteLevel, post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges },
  };
  const split = (pattern, behavior, invert) => ({ type: 'Split', pattern, behavior, invert });
  const seq = (...pretokenizers) => ({ type: 'Sequence', pretokenizers });
  const token = (id, content, options) => ({ id, content, single_word: false, lstrip: false,
    rstrip: false, normalized: false, special: false, ...options });
  const metaspaceDecoder = { type: 'Sequence', decoders: [
    { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' }, { type: 'ByteFallback' },
    { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] };
  const spModel = { ...base.model, byte_fallback: true, unk_token: '<unk>', fuse_unk: true };
  const variants = [];
  for (const behavior of ['Removed', 'Isolated', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous']) {
    for (const invert of [false, true]) {
      variants.push({ name: `split-${behavior}${invert ? '-invert' : ''}`, overrides: {
        pre_tokenizer: seq(split({ Regex: '\\s+|[,.]' }, behavior, invert), byteLevel) } });
    }
  }
  variants.push(
    { name: 'split-string', overrides: { pre_tokenizer: seq(split({ String: 'an' }, 'Isolated', false), byteLevel) } },
    { name: 'digits', overrides: { pre_tokenizer: seq({ type: 'Digits', individual_digits: false }, byteLevel) } },
    { name: 'digits-individual', overrides: { pre_tokenizer: seq({ type: 'Digits', individual_digits: true }, byteLevel) } },
    { name: 'byte-level-gpt2', overrides: { pre_tokenizer: { ...byteLevel, add_prefix_space: true, use_regex: true } } },
    { name: 'nfkc-lowercase', overrides: { normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Lowercase' }] } } },
    { name: 'nfd-replace-prepend', overrides: { normalizer: { type: 'Sequence', normalizers: [
      { type: 'NFD' }, { type: 'Replace', pattern: { Regex: '[0-9]+' }, content: '#' },
      { type: 'Replace', pattern: { String: 'the' }, content: 'THE' }, { type: 'Prepend', prepend: '>' }] } } },
    { name: 'added-tokens', overrides: { added_tokens: [...added,
      token(size + 2, '<mask>', { lstrip: true, special: true }),
      token(size + 3, '[R]', { rstrip: true }),
      token(size + 4, 'word', { single_word: true }),
      token(size + 5, 'norm', { normalized: true }),
      token(size + 6, '<mas', {})],
      normalizer: { type: 'Lowercase' } } },
    { name: 'template-bos-eos', overrides: { post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
      { type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                 { SpecialToken: { id: '</s>', type_id: 0 } }],
        pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<s>': { id: '<s>', ids: [size], tokens: ['<s>'] },
                          '</s>': { id: '</s>', ids: [size + 1], tokens: ['</s>'] } } }] } } },
    { name: 'roberta', overrides: { post_processor: { type: 'RobertaProcessing', sep: ['</s>', size + 1],
      cls: ['<s>', size], trim_offsets: true, add_prefix_space: false } } },
    { name: 'metaspace-always', overrides: { pre_tokenizer: { type: 'Metaspace', replacement: '\u2581',
      prepend_scheme: 'always', split: true }, decoder: { type: 'Metaspace', replacement: '\u2581',
      prepend_scheme: 'always', split: true }, model: spModel } },
    { name: 'metaspace-never-nosplit', overrides: { pre_tokenizer: { type: 'Metaspace', replacement: '\u2581',
      prepend_scheme: 'never', split: false }, decoder: metaspaceDecoder, model: spModel } },
    { name: 'metaspace-legacy', overrides: { pre_tokenizer: { type: 'Metaspace', replacement: '\u2581',
      add_prefix_space: true }, decoder: { type: 'Metaspace', replacement: '\u2581', add_prefix_space: true },
      model: spModel } },
    { name: 'unk-fused', overrides: { pre_tokenizer: split({ String: ' ' }, 'Removed', false),
      decoder: { type: 'Fuse' }, model: { ...base.model, unk_token: '<unk>', fuse_unk: true } } },
    { name: 'unk-unfused-no-decoder', overrides: { pre_tokenizer: split({ String: ' ' }, 'Removed', false),
      decoder: null, model: { ...base.model, unk_token: '<unk>', fuse_unk: false } } },
    { name: 'no-unk-dropped', overrides: { pre_tokenizer: null, decoder: { type: 'Fuse' } } },
    { name: 'ignore-merges', overrides: { model: { ...base.model, ignore_merges: true } } },
    { name: 'merges-strings', overrides: { model: { ...base.model, merges: merges.map(([a, b]) => `${a} ${b}`) } } },
  );
  const texts = ['', 'the and thing', 'The  THE\tthe, them. ' + 'abab'.repeat(5), 'in 123 and 4567, 1.5',
    'Ｆｕｌｌ ① café cafe\u0301 Ωmega', 'a<mask> b  <mask>c [R]   x word wordy sword word', 'norm NORM <mas <s>x</s>',
    ' leading and trailing ', 'ü€😀 中文\n\r\n', 'x'.repeat(40)];
  const out = { base, variants: [] };
  for (const v of variants) {
    const json = { ...base, ...v.overrides };
    const rust = await RustTokenizer.fromJSON(new TextEncoder().encode(JSON.stringify(json)));
    const special = new Set(json.added_tokens.filter((t) => t.special).map((t) => t.id));
    const cases = [];
    for (const text of texts) {
      const ids = Array.from(rust.encode(text));
      const kept = ids.filter((id) => !special.has(id));
      cases.push({ text, ids,
        decoded: ids.length ? rust.decode(Int32Array.from(ids)) : '',
        decoded_skipping_special: kept.length ? rust.decode(Int32Array.from(kept)) : '' });
    }
    out.variants.push({ name: v.name, overrides: v.overrides, cases });
  }
  fs.writeFileSync(path.join(here, 'synthetic.json'), JSON.stringify(out) + '\n');
  console.log(`synthetic: ${variants.length} variants of ${texts.length} texts`);
}
