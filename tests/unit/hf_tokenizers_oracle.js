// The oracle of tests/unit/tokenizer_test.cpp: Hugging Face's own `tokenizers` library (its npm
// package, which scripts/setup.sh installs) encodes and decodes what the test asks.
// Usage: node hf_tokenizers_oracle.js PACKAGE_DIR TOKENIZER_JSON REQUEST_JSON
//   REQUEST_JSON: {"encode": [text, ...], "decode": [[id, ...], ...]}
//   stdout:       {"encode": [[id, ...], ...], "decode": [text, ...], "decode_skip": [text, ...]}
// encode adds special tokens (HF's default); decode_skip skips them.
'use strict';
const fs = require('fs');
const [packageDir, tokenizerPath, requestPath] = process.argv.slice(2);
const { Tokenizer } = require(packageDir);

(async () => {
  const tokenizer = Tokenizer.fromFile(tokenizerPath);
  const request = JSON.parse(fs.readFileSync(requestPath, 'utf8'));
  const answer = { encode: [], decode: [], decode_skip: [] };
  for (const text of request.encode) {
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens: true });
    answer.encode.push(encoding.getIds());
  }
  for (const ids of request.decode) {
    answer.decode.push(await tokenizer.decode(ids, false));
    answer.decode_skip.push(await tokenizer.decode(ids, true));
  }
  process.stdout.write(JSON.stringify(answer));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
