#include "data/tokenize_tool.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "comm/file_io.h"
#include "data/megatron_data.h"
#include "data/text_corpus.h"
#include "data/token_files.h"
#include "data/tokenizer.h"

namespace fleet::data {

std::string MegatronOutputPrefix(const TokenizeToolOptions& options) {
  return options.output_prefix + "_" + options.json_key + "_document";
}

Status RunTokenize(const TokenizeToolOptions& o, std::ostream& log) {
  if (o.output_prefix.empty())
    return Status::InvalidArgument("must name the output", "--output_prefix");
  const bool bin = o.output_format == "bin" || o.output_format == "both";
  const bool fleetx = o.output_format == "fleetx" || o.output_format == "both";
  const bool megatron = o.output_format == "megatron";
  if (!bin && !fleetx && !megatron) {
    return Status::InvalidArgument(
        "must be bin, fleetx, both or megatron, got '" + o.output_format + "'", "--output_format");
  }
  if (o.shard_tokens < 1) return Status::InvalidArgument("must be >= 1", "--shard_tokens");

  TextCorpusOptions text;
  text.json_key = o.json_key;
  text.shuffle_documents = o.shuffle_documents;
  text.shuffle_seed = o.shuffle_seed;
  if (o.input.empty()) {
    FLEET_ASSIGN_OR_RETURN(text.files, DefaultCorpusFiles());
    text.format = TextFormat::kPercent;
  } else {
    FLEET_ASSIGN_OR_RETURN(text.files, ExpandFileSpec(o.input));
    auto format = ParseTextFormat(o.text_format);
    if (!format.ok()) return format.status().WithContext("--text_format");
    text.format = *format;
  }
  FLEET_ASSIGN_OR_RETURN(auto tokenizer, MakeTokenizer(o.tokenizer, o.vocab_dir));
  FLEET_ASSIGN_OR_RETURN(TokenizedText t, TokenizeTextFiles(text, *tokenizer));

  const std::span<const int32_t> tokens(t.tokens);
  if (bin) {
    if (tokenizer->vocab_size() > 65536) {
      return Status::InvalidArgument("llm.c shards hold uint16 ids; this vocabulary is larger",
                                     "--output_format");
    }
    const int64_t shards =
        (static_cast<int64_t>(tokens.size()) + o.shard_tokens - 1) / o.shard_tokens;
    for (int64_t s = 0; s < shards; ++s) {
      char suffix[32];
      std::snprintf(suffix, sizeof(suffix), "_%06lld.bin", static_cast<long long>(s));
      const std::string path = o.output_prefix + suffix;
      const size_t begin = static_cast<size_t>(s * o.shard_tokens);
      const size_t n = std::min<size_t>(o.shard_tokens, tokens.size() - begin);
      FLEET_RETURN_IF_ERROR(WriteLlmcShard(path, tokens.subspan(begin, n)));
      log << "tokenize: wrote " << path << " (" << n << " tokens)\n";
    }
  }
  if (fleetx) {
    FLEET_RETURN_IF_ERROR(
        WriteFleetXData(o.output_prefix, tokens, t.doc_lens, tokenizer->vocab_size()));
    log << "tokenize: wrote " << o.output_prefix << "_ids.npy and " << o.output_prefix
        << "_idx.npz (" << tokens.size() << " tokens, " << t.doc_lens.size() << " documents)\n";
  }
  if (megatron) {
    // preprocess_data.py's name: <output_prefix>_<json key>_document.
    const std::string prefix = MegatronOutputPrefix(o);
    FLEET_RETURN_IF_ERROR(
        WriteMegatronIndexed(prefix, tokens, t.doc_lens, tokenizer->vocab_size()));
    log << "tokenize: wrote " << prefix << ".bin and " << prefix << ".idx (" << tokens.size()
        << " tokens, " << t.doc_lens.size() << " documents)\n";
  }
  log << "tokenize: " << text.files.size() << " file(s), " << t.doc_lens.size() << " documents, "
      << tokens.size() << " " << tokenizer->name() << " tokens\n";
  return Status::OK();
}

}  // namespace fleet::data
