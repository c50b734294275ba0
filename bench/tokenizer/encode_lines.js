// Hugging Face's ids for each line of a UTF-8 file, a line of space-separated ids per line, as
// `trainyard tokenize` and tokenizer_bench --ids-out write them.
// Usage: node encode_lines.js PACKAGE_DIR TOKENIZER_JSON IN.txt OUT.txt
'use strict';
const fs = require('fs');
const [packageDir, tokenizerPath, input, output] = process.argv.slice(2);
const tokenizer = require(packageDir).Tokenizer.fromFile(tokenizerPath);
const lines = fs.readFileSync(input).toString('utf8').split('\n');
if (lines[lines.length - 1] === '') lines.pop();
(async () => {
  const out = [];
  for (let i = 0; i < lines.length; i += 1000) {
    for (const e of await tokenizer.encodeBatch(lines.slice(i, i + 1000))) {
      out.push(e.getIds().join(' '));
    }
  }
  fs.writeFileSync(output, out.join('\n') + (out.length ? '\n' : ''));
})();
