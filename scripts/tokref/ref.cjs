// Reference tokenizer for internal/tokens' tests (see reference_test.go).
//
// Usage: node ref.cjs NODE_MODULES_DIR < request.json > response.json
//
// request:  {"tokenizer": PATH, "config": PATH, "texts": [STRING...],
//            "chats": [{"messages": [...], "add_generation_prompt": BOOL,
//                       "tools": [...] (optional), "kwargs": {...} (optional)}]}
// response: {"lenml": [[ID...]...], "hf": [[ID...]...],
//            "chats": [{"text": STRING, "lenml": [ID...], "hf": [ID...],
//                       "lenml_text": STRING|null, "lenml_error": STRING|null}
//                      | {"error": STRING}]}
//
// Token ids come from two independent JavaScript ports of Hugging Face
// tokenizers: @lenml/tokenizers (a fork of transformers.js) and
// @huggingface/tokenizers (which translates the Oniguruma split patterns
// faithfully). Texts are encoded without special tokens added. Chat
// templates are rendered with @huggingface/jinja the way transformers.js'
// apply_chat_template does: the conversation plus the tokenizer config's
// special tokens as variables.
"use strict";
const fs = require("fs");
const path = require("path");

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node ref.cjs NODE_MODULES_DIR < request.json");
  process.exit(2);
}
const load = (name) => require(path.join(dir, name));
const lenml = load("@lenml/tokenizers");
const hf = load("@huggingface/tokenizers");
const { Template } = load("@huggingface/jinja");

const req = JSON.parse(fs.readFileSync(0, "utf8"));
const tokJSON = JSON.parse(fs.readFileSync(req.tokenizer, "utf8"));
const cfg = JSON.parse(fs.readFileSync(req.config, "utf8"));

const lt = lenml.TokenizerLoader.fromPreTrained({ tokenizerJSON: tokJSON, tokenizerConfig: cfg });
const ht = new hf.Tokenizer(tokJSON, cfg);

const out = { lenml: [], hf: [], chats: [] };
for (const text of req.texts || []) {
  out.lenml.push(Array.from(lt.encode(text, { add_special_tokens: false })));
  out.hf.push(Array.from(ht.encode(text, { add_special_tokens: false }).ids));
}

// Special tokens as template variables (transformers' special_tokens_map):
// a token given as an object {content: ...} is passed as its content.
const specials = {};
for (const k of ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]) {
  const v = cfg[k];
  if (typeof v === "string") specials[k] = v;
  else if (v && typeof v.content === "string") specials[k] = v.content;
}
if (req.chats && req.chats.length) {
  const tmpl = new Template(cfg.chat_template);
  for (const c of req.chats) {
    try {
      const vars = Object.assign({}, specials, c.kwargs || {}, {
        messages: c.messages,
        add_generation_prompt: !!c.add_generation_prompt,
      });
      if (c.tools) vars.tools = c.tools;
      const text = tmpl.render(vars);
      // @lenml/tokenizers' own apply_chat_template bundles an older Jinja
      // that cannot parse some templates (Qwen 3's "set ns.x"): its text,
      // or why it failed, is passed on for the test to log.
      let lenmlText = null, lenmlError = null;
      try {
        lenmlText = lt.apply_chat_template(c.messages, Object.assign({}, c.kwargs || {}, {
          tokenize: false, add_generation_prompt: !!c.add_generation_prompt,
        }));
      } catch (e) {
        lenmlError = String(e && e.message ? e.message : e);
      }
      out.chats.push({
        text,
        lenml_text: lenmlText,
        lenml_error: lenmlError,
        lenml: Array.from(lt.encode(text, { add_special_tokens: false })),
        hf: Array.from(ht.encode(text, { add_special_tokens: false }).ids),
      });
    } catch (e) {
      out.chats.push({ error: String(e && e.message ? e.message : e) });
    }
  }
}
process.stdout.write(JSON.stringify(out));
