#include "collective/config/megatron_args.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/file_system.h"
#include "comm/yaml_config.h"

namespace fleet::trainer::config {

namespace {

// Megatron-LM v1.1.5's defaults (arguments.py), in FleetPS's keys. The flags
// and the DeepSpeed JSON override them.
constexpr char kMegatronDefaults[] = R"(Global:
  seed: 1234
  micro_batch_size: 1
  local_batch_size: 1
Engine:
  logging_freq: 100
  eval_freq: 1000
  eval_iters: 100
  test_iters: 100
  save_load:
    save_steps: -1
    output_dir: ./output
Model:
  vocab_size: 50257
  vocab_size_divisible_unit: 128
  hidden_dropout_prob: 0.1
  attention_probs_dropout_prob: 0.1
  initializer_range: 0.02
Optimizer:
  name: AdamW
  weight_decay: 0.01
  beta1: 0.9
  beta2: 0.999
  epsilon: 1.0e-8
  lr:
    name: LinearAnnealingWithWarmupDecay
    min_lr: 0.0
    warmup_rate: 0.01
  grad_clip:
    clip_norm: 1.0
)";

// ---- the flags -------------------------------------------------------------------------

struct Flags {
  std::optional<int64_t> model_parallel_size, num_layers, hidden_size, num_attention_heads,
      batch_size, seq_length, max_position_embeddings, train_iters, save_interval, eval_interval,
      eval_iters, log_interval, lr_decay_iters, seed, vocab_divisible, loss_scale_window,
      hysteresis, local_rank;
  std::optional<double> lr, min_lr, weight_decay, clip_grad, warmup, hidden_dropout,
      attention_dropout, adam_beta1, adam_beta2, adam_eps, init_method_std, loss_scale,
      initial_loss_scale, min_loss_scale;
  std::optional<std::string> save, load, data_path, vocab_file, merge_file, tokenizer_type, split,
      distributed_backend, lr_decay_style, deepspeed_config;
  std::vector<std::string> train_data;
  bool fp16 = false, cpu_optimizer = false, checkpoint_activations = false, lazy_loader = false,
       deepspeed = false;
};

using Field = std::variant<std::optional<int64_t> Flags::*, std::optional<double> Flags::*,
                           std::optional<std::string> Flags::*, std::vector<std::string> Flags::*,
                           bool Flags::*>;

struct FlagSpec {
  std::string_view name;
  Field field;
};

const FlagSpec kFlags[] = {
    {"model-parallel-size", &Flags::model_parallel_size},
    {"num-layers", &Flags::num_layers},
    {"hidden-size", &Flags::hidden_size},
    {"num-attention-heads", &Flags::num_attention_heads},
    {"max-position-embeddings", &Flags::max_position_embeddings},
    {"seq-length", &Flags::seq_length},
    {"batch-size", &Flags::batch_size},
    {"train-iters", &Flags::train_iters},
    {"lr", &Flags::lr},
    {"min-lr", &Flags::min_lr},
    {"lr-decay-style", &Flags::lr_decay_style},
    {"lr-decay-iters", &Flags::lr_decay_iters},
    {"warmup", &Flags::warmup},
    {"weight-decay", &Flags::weight_decay},
    {"clip-grad", &Flags::clip_grad},
    {"adam-beta1", &Flags::adam_beta1},
    {"adam-beta2", &Flags::adam_beta2},
    {"adam-eps", &Flags::adam_eps},
    {"hidden-dropout", &Flags::hidden_dropout},
    {"attention-dropout", &Flags::attention_dropout},
    {"init-method-std", &Flags::init_method_std},
    {"seed", &Flags::seed},
    {"make-vocab-size-divisible-by", &Flags::vocab_divisible},
    {"fp16", &Flags::fp16},
    {"loss-scale", &Flags::loss_scale},
    {"initial-loss-scale", &Flags::initial_loss_scale},
    {"min-loss-scale", &Flags::min_loss_scale},
    {"loss-scale-window", &Flags::loss_scale_window},
    {"hysteresis", &Flags::hysteresis},
    {"checkpoint-activations", &Flags::checkpoint_activations},
    {"save", &Flags::save},
    {"load", &Flags::load},
    {"save-interval", &Flags::save_interval},
    {"log-interval", &Flags::log_interval},
    {"eval-interval", &Flags::eval_interval},
    {"eval-iters", &Flags::eval_iters},
    {"data-path", &Flags::data_path},
    {"train-data", &Flags::train_data},
    {"split", &Flags::split},
    {"vocab-file", &Flags::vocab_file},
    {"merge-file", &Flags::merge_file},
    {"tokenizer-type", &Flags::tokenizer_type},
    {"cpu-optimizer", &Flags::cpu_optimizer},
    {"distributed-backend", &Flags::distributed_backend},
    {"lazy-loader", &Flags::lazy_loader},
    {"local_rank", &Flags::local_rank},
    {"deepspeed", &Flags::deepspeed},
    {"deepspeed_config", &Flags::deepspeed_config},
};

const FlagSpec* FindFlag(std::string_view name) {
  for (const FlagSpec& f : kFlags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string FlagText(std::string_view name) { return absl::StrCat("--", std::string(name)); }

Status SetFlag(const FlagSpec& spec, const std::string& value, Flags* flags) {
  const std::string flag = FlagText(spec.name);
  return std::visit(
      [&](auto member) -> Status {
        using T = std::remove_cvref_t<decltype(flags->*member)>;
        if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          int64_t v = 0;
          if (!absl::SimpleAtoi(value, &v)) {
            return Status::InvalidArgument("'" + value + "' is not an integer", flag);
          }
          flags->*member = v;
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          double v = 0;
          if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
            return Status::InvalidArgument("'" + value + "' is not a number", flag);
          }
          flags->*member = v;
        } else if constexpr (std::is_same_v<T, std::optional<std::string>>) {
          flags->*member = value;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          (flags->*member).push_back(value);
        } else {
          flags->*member = true;
        }
        return Status::OK();
      },
      spec.field);
}

bool IsSwitch(const FlagSpec& spec) { return std::holds_alternative<bool Flags::*>(spec.field); }
bool IsList(const FlagSpec& spec) {
  return std::holds_alternative<std::vector<std::string> Flags::*>(spec.field);
}

// ---- the translation -------------------------------------------------------------------

// What the flags and the JSON set: "Key=value" assignments, each with the
// flag or JSON key it came from (for errors and notes).
class Translation {
 public:
  void Set(const std::string& key, const std::string& value, const std::string& source) {
    assignments_.push_back({key + "=" + value, source});
  }
  void Note(std::string line) { notes_.push_back(std::move(line)); }
  const std::vector<std::pair<std::string, std::string>>& assignments() const {
    return assignments_;
  }
  std::vector<std::string>& notes() { return notes_; }

 private:
  std::vector<std::pair<std::string, std::string>> assignments_;
  std::vector<std::string> notes_;
};

std::string Num(double v) {
  // The shortest text that reads back as v (absl::StrCat keeps 6 digits).
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  std::string s(buf, end);
  // YAML reads "1e-05" as a string; give it a mantissa with a point.
  if (s.find('e') != std::string::npos && s.find('.') == std::string::npos) {
    s.insert(s.find('e'), ".0");
  }
  return s;
}

// The DeepSpeed config, read as JSON and checked key by key.
class DeepSpeedConfig {
 public:
  static Result<DeepSpeedConfig> Load(const std::string& path) {
    FLEET_ASSIGN_OR_RETURN(std::string text, DefaultFileSystem()->ReadFile(path));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument("not a JSON object (a DeepSpeed config)", path);
    }
    return DeepSpeedConfig(path, std::move(j));
  }

  // The value at a dotted path, if present (and not null).
  const nlohmann::json* Find(std::string_view dotted) const {
    const nlohmann::json* at = &root_;
    const std::string path(dotted);
    for (absl::string_view part : absl::StrSplit(path, '.')) {
      if (!at->is_object()) return nullptr;
      auto it = at->find(std::string(part));
      if (it == at->end() || it->is_null()) return nullptr;
      at = &*it;
    }
    return at;
  }
  std::string Source(std::string_view dotted) const {
    return absl::StrCat(path_, ": ", std::string(dotted));
  }
  Status Bad(std::string_view dotted, std::string_view what) const {
    return Status::InvalidArgument(absl::StrCat(std::string(dotted), ": ", std::string(what)),
                                   path_);
  }
  Result<std::optional<double>> Number(std::string_view dotted) const {
    const nlohmann::json* v = Find(dotted);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return Bad(dotted, "must be a number, got " + v->dump());
    return std::optional<double>(v->get<double>());
  }
  Result<std::optional<int64_t>> Int(std::string_view dotted, int64_t min) const {
    const nlohmann::json* v = Find(dotted);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer() || v->get<int64_t>() < min) {
      return Bad(dotted, absl::StrCat("must be an integer >= ", min, ", got ", v->dump()));
    }
    return std::optional<int64_t>(v->get<int64_t>());
  }
  Result<bool> Bool(std::string_view dotted) const {
    const nlohmann::json* v = Find(dotted);
    if (v == nullptr) return false;
    if (!v->is_boolean()) return Bad(dotted, "must be true or false, got " + v->dump());
    return v->get<bool>();
  }
  Result<std::string> String(std::string_view dotted) const {
    const nlohmann::json* v = Find(dotted);
    if (v == nullptr) return std::string();
    if (!v->is_string()) return Bad(dotted, "must be a string, got " + v->dump());
    return v->get<std::string>();
  }
  // Every key under `prefix` (an object) that `known` does not hold.
  void Unknown(const std::string& prefix, const std::vector<std::string_view>& known,
               std::vector<std::string>* out) const {
    const nlohmann::json* at = prefix.empty() ? &root_ : Find(prefix);
    if (at == nullptr || !at->is_object()) return;
    for (const auto& [key, value] : at->items()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        out->push_back(prefix.empty() ? key : prefix + "." + key);
      }
    }
  }
  const std::string& path() const { return path_; }

 private:
  DeepSpeedConfig(std::string path, nlohmann::json root)
      : path_(std::move(path)), root_(std::move(root)) {}
  std::string path_;
  nlohmann::json root_;
};

Status TranslateModelAndData(const Flags& f, const MegatronTarget& target, Translation* t) {
  struct Required {
    const std::optional<int64_t>& value;
    std::string_view flag;
  };
  for (const Required& r : {Required{f.num_layers, "num-layers"},
                            {f.hidden_size, "hidden-size"},
                            {f.num_attention_heads, "num-attention-heads"},
                            {f.seq_length, "seq-length"},
                            {f.max_position_embeddings, "max-position-embeddings"},
                            {f.train_iters, "train-iters"}}) {
    if (!r.value) {
      return Status::InvalidArgument("missing: Megatron requires it", FlagText(r.flag));
    }
  }
  t->Set("Global.device", target.gpu ? "gpu" : "cpu", "the job's devices");
  if (!target.gpu) {
    t->Note("no GPU for this job: the ranks run on CPUs (float32 whatever --fp16 asks)");
  }
  const auto set_int = [&](const std::optional<int64_t>& v, std::string_view key,
                           std::string_view flag) {
    if (v) t->Set(std::string(key), std::to_string(*v), FlagText(flag));
  };
  const auto set_num = [&](const std::optional<double>& v, std::string_view key,
                           std::string_view flag) {
    if (v) t->Set(std::string(key), Num(*v), FlagText(flag));
  };
  set_int(f.num_layers, "Model.num_layers", "num-layers");
  set_int(f.hidden_size, "Model.hidden_size", "hidden-size");
  set_int(f.num_attention_heads, "Model.num_attention_heads", "num-attention-heads");
  set_int(f.max_position_embeddings, "Model.max_position_embeddings", "max-position-embeddings");
  set_int(f.vocab_divisible, "Model.vocab_size_divisible_unit", "make-vocab-size-divisible-by");
  set_num(f.hidden_dropout, "Model.hidden_dropout_prob", "hidden-dropout");
  set_num(f.attention_dropout, "Model.attention_probs_dropout_prob", "attention-dropout");
  set_num(f.init_method_std, "Model.initializer_range", "init-method-std");
  if (f.checkpoint_activations) t->Set("Model.use_recompute", "True", "--checkpoint-activations");
  set_int(f.seed, "Global.seed", "seed");
  set_int(f.model_parallel_size, "Distributed.mp_degree", "model-parallel-size");

  if (f.tokenizer_type && *f.tokenizer_type != "GPT2BPETokenizer") {
    return Status::InvalidArgument("'" + *f.tokenizer_type +
                                       "': FleetPS's GPT tokenizer is GPT-2's BPE "
                                       "(GPT2BPETokenizer)",
                                   "--tokenizer-type");
  }
  if (f.vocab_file.has_value() != f.merge_file.has_value()) {
    return Status::InvalidArgument("goes with --merge-file / --vocab-file",
                                   f.vocab_file ? "--vocab-file" : "--merge-file");
  }
  if (f.data_path.has_value() == !f.train_data.empty()) {
    return Status::InvalidArgument(
        f.data_path ? "give --data-path or --train-data, not both"
                    : "missing: the data (Megatron's indexed dataset PREFIX, or --train-data "
                      "FILE.json)",
        "--data-path");
  }
  std::vector<std::string> split = {"969", "30", "1"};
  if (f.split) split = absl::StrSplit(*f.split, ',', absl::SkipWhitespace());
  for (std::string& w : split) {
    w = std::string(absl::StripAsciiWhitespace(w));
    double v = 0;
    if (!absl::SimpleAtod(w, &v) || v < 0) {
      return Status::InvalidArgument("'" + *f.split + "' is not comma-separated weights",
                                     "--split");
    }
  }
  const std::string split_yaml = "[" + absl::StrJoin(split, ", ") + "]";
  for (size_t p = 0; p < 3; ++p) {
    // Megatron builds no dataset for a part of weight 0.
    double weight = 0;
    if (p < split.size()) (void)absl::SimpleAtod(split[p], &weight);
    if (p > 0 && weight == 0) continue;
    const std::string_view part = p == 0 ? "Train" : p == 1 ? "Eval" : "Test";
    const std::string key = absl::StrCat("Data.", std::string(part), ".dataset.");
    if (f.data_path) {
      t->Set(key + "name", "MegatronGPTDataset", "--data-path");
      t->Set(key + "input_files", *f.data_path, "--data-path");
    } else {
      t->Set(key + "name", "TextDataset", "--train-data");
      t->Set(key + "input_files", absl::StrJoin(f.train_data, ","), "--train-data");
      t->Set(key + "text_format", "jsonl", "--train-data");
    }
    t->Set(key + "split", split_yaml, f.split ? "--split" : "Megatron's default split");
    t->Set(key + "max_seq_len", std::to_string(*f.seq_length), "--seq-length");
    t->Set(key + "tokenizer", "gpt2", "--tokenizer-type");
    if (f.vocab_file) {
      t->Set(key + "vocab_file", *f.vocab_file, "--vocab-file");
      t->Set(key + "merge_file", *f.merge_file, "--merge-file");
    }
  }
  if (f.lazy_loader) {
    t->Note("--lazy-loader: accepted; the text is tokenized once into a cache and memory-mapped");
  }
  if (f.distributed_backend && *f.distributed_backend != "nccl" &&
      *f.distributed_backend != "gloo") {
    return Status::InvalidArgument("'" + *f.distributed_backend + "': nccl or gloo",
                                   "--distributed-backend");
  }
  if (f.distributed_backend) {
    t->Note("--distributed-backend " + *f.distributed_backend +
            ": accepted; FleetPS uses NCCL on GPUs and shared memory (one node) or Gloo on CPU "
            "ranks");
  }
  if (f.local_rank) t->Note("--local_rank: accepted; the rank comes from fleetrun");
  return Status::OK();
}

Status TranslateEngine(const Flags& f, Translation* t) {
  t->Set("Engine.max_steps", std::to_string(*f.train_iters), "--train-iters");
  if (f.log_interval) {
    t->Set("Engine.logging_freq", std::to_string(*f.log_interval), "--log-interval");
  }
  if (f.eval_interval) {
    t->Set("Engine.eval_freq", std::to_string(*f.eval_interval), "--eval-interval");
  }
  if (f.eval_iters) {
    t->Set("Engine.eval_iters", std::to_string(*f.eval_iters), "--eval-iters");
    t->Set("Engine.test_iters", std::to_string(*f.eval_iters), "--eval-iters");
  }
  if (f.save) t->Set("Engine.save_load.output_dir", *f.save, "--save");
  if (f.load) t->Set("Engine.save_load.ckpt_dir", *f.load, "--load");
  if (f.save_interval) {
    t->Set("Engine.save_load.save_steps", std::to_string(*f.save_interval), "--save-interval");
  }
  if (!f.save) {
    t->Note("no --save: checkpoints go to ./output (FleetPS saves at the end of a run)");
  }
  if (f.fp16) {
    t->Set("Engine.mix_precision.enable", "True", "--fp16");
    t->Set("Engine.mix_precision.dtype", "float16", "--fp16");
    // Megatron's dynamic scaler starts at 2^32 (--initial-loss-scale).
    t->Set("Engine.mix_precision.scale_loss", Num(f.initial_loss_scale.value_or(4294967296.0)),
           "--initial-loss-scale");
    t->Set("Engine.mix_precision.decr_every_n_nan_or_inf", std::to_string(f.hysteresis.value_or(2)),
           "--hysteresis");
    t->Set("Engine.mix_precision.incr_every_n_steps",
           std::to_string(f.loss_scale_window.value_or(1000)), "--loss-scale-window");
    t->Set("Engine.mix_precision.min_loss_scale", Num(f.min_loss_scale.value_or(1.0)),
           "--min-loss-scale");
    if (f.loss_scale) {
      t->Set("Engine.mix_precision.scale_loss", Num(*f.loss_scale), "--loss-scale");
      t->Set("Engine.mix_precision.use_dynamic_loss_scaling", "False", "--loss-scale");
    }
  }
  return Status::OK();
}

Status TranslateOptimizer(const Flags& f, Translation* t) {
  if (f.lr) t->Set("Optimizer.lr.max_lr", Num(*f.lr), "--lr");
  if (f.min_lr) t->Set("Optimizer.lr.min_lr", Num(*f.min_lr), "--min-lr");
  const int64_t decay = f.lr_decay_iters.value_or(*f.train_iters);
  t->Set("Optimizer.lr.decay_steps", std::to_string(decay),
         f.lr_decay_iters ? "--lr-decay-iters" : "--train-iters");
  if (f.warmup) t->Set("Optimizer.lr.warmup_rate", Num(*f.warmup), "--warmup");
  if (f.lr_decay_style) {
    const std::string& style = *f.lr_decay_style;
    const std::string name = style == "cosine"     ? "CosineAnnealingWithWarmupDecay"
                             : style == "linear"   ? "LinearAnnealingWithWarmupDecay"
                             : style == "constant" ? "ConstantWithWarmup"
                                                   : "";
    if (name.empty()) {
      return Status::InvalidArgument(
          "'" + style + "': FleetPS's schedules are linear, cosine and constant",
          "--lr-decay-style");
    }
    t->Set("Optimizer.lr.name", name, "--lr-decay-style");
  }
  if (f.weight_decay) t->Set("Optimizer.weight_decay", Num(*f.weight_decay), "--weight-decay");
  if (f.clip_grad) t->Set("Optimizer.grad_clip.clip_norm", Num(*f.clip_grad), "--clip-grad");
  if (f.adam_beta1) t->Set("Optimizer.beta1", Num(*f.adam_beta1), "--adam-beta1");
  if (f.adam_beta2) t->Set("Optimizer.beta2", Num(*f.adam_beta2), "--adam-beta2");
  if (f.adam_eps) t->Set("Optimizer.epsilon", Num(*f.adam_eps), "--adam-eps");
  if (f.warmup.value_or(0.01) > 0) {
    t->Note(
        "--warmup: the learning rate rises from lr / warmup steps at the first step "
        "(Megatron's from 0)");
  }
  return Status::OK();
}

// The batch sizes: Megatron's --batch-size is the per-GPU micro-batch;
// DeepSpeed's train_batch_size = micro x accumulation x data-parallel ranks,
// any two of which determine the third.
Status TranslateBatches(const Flags& f, const DeepSpeedConfig* ds, int64_t dp_world,
                        Translation* t) {
  std::optional<int64_t> micro = f.batch_size, gas, global;
  std::string micro_source = "--batch-size", global_source, gas_source;
  if (ds != nullptr) {
    FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> ds_micro,
                           ds->Int("train_micro_batch_size_per_gpu", 1));
    FLEET_ASSIGN_OR_RETURN(gas, ds->Int("gradient_accumulation_steps", 1));
    FLEET_ASSIGN_OR_RETURN(global, ds->Int("train_batch_size", 1));
    gas_source = ds->Source("gradient_accumulation_steps");
    global_source = ds->Source("train_batch_size");
    if (ds_micro && micro && *ds_micro != *micro) {
      return ds->Bad("train_micro_batch_size_per_gpu",
                     absl::StrCat(*ds_micro, " differs from --batch-size ", *micro));
    }
    if (ds_micro && !micro) {
      micro = ds_micro;
      micro_source = ds->Source("train_micro_batch_size_per_gpu");
    }
    if (!micro && global && gas) {
      if (*global % (*gas * dp_world) != 0) {
        return ds->Bad("train_batch_size",
                       absl::StrCat(*global, " is not gradient_accumulation_steps ", *gas, " x ",
                                    dp_world, " data-parallel ranks x a micro-batch"));
      }
      micro = *global / (*gas * dp_world);
      micro_source = global_source;
    }
  }
  if (!micro) {
    return Status::InvalidArgument(
        "missing: Megatron requires it (or DeepSpeed's train_micro_batch_size_per_gpu)",
        "--batch-size");
  }
  if (global && !gas) {
    if (*global % (*micro * dp_world) != 0) {
      return ds->Bad("train_batch_size",
                     absl::StrCat(*global, " is not a multiple of the micro-batch ", *micro, " x ",
                                  dp_world, " data-parallel ranks"));
    }
    gas = *global / (*micro * dp_world);
    gas_source = global_source;
  }
  if (global && *global != *micro * gas.value_or(1) * dp_world) {
    return ds->Bad("train_batch_size",
                   absl::StrCat(*global, " must equal the micro-batch ", *micro,
                                " x gradient_accumulation_steps ", gas.value_or(1), " x ", dp_world,
                                " data-parallel ranks (as DeepSpeed requires)"));
  }
  t->Set("Global.micro_batch_size", std::to_string(*micro), micro_source);
  t->Set("Global.local_batch_size", std::to_string(*micro * gas.value_or(1)),
         gas ? gas_source : micro_source);
  return Status::OK();
}

Status TranslateDeepSpeed(const Flags& f, const DeepSpeedConfig& ds, int64_t dp_world,
                          Translation* t) {
  std::vector<std::string> unknown;
  ds.Unknown("",
             {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "gradient_clipping", "optimizer", "scheduler", "fp16", "bf16", "zero_optimization",
              "activation_checkpointing", "steps_per_print", "wall_clock_breakdown"},
             &unknown);
  // Clipping, optimizer and schedule: DeepSpeed's win over the flags.
  FLEET_ASSIGN_OR_RETURN(std::optional<double> clip, ds.Number("gradient_clipping"));
  if (clip) {
    if (*clip < 0) return ds.Bad("gradient_clipping", "must be >= 0");
    t->Set("Optimizer.grad_clip.clip_norm", Num(*clip), ds.Source("gradient_clipping"));
    if (f.clip_grad && *f.clip_grad != *clip) {
      t->Note(absl::StrCat("DeepSpeed's gradient_clipping ", *clip, " wins over --clip-grad ",
                           *f.clip_grad));
    }
  }
  if (ds.Find("optimizer") != nullptr) {
    ds.Unknown("optimizer", {"type", "params"}, &unknown);
    ds.Unknown("optimizer.params", {"lr", "betas", "eps", "weight_decay", "adam_w_mode"}, &unknown);
    FLEET_ASSIGN_OR_RETURN(std::string type, ds.String("optimizer.type"));
    std::string lower = type;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower != "adam" && lower != "adamw") {
      return ds.Bad("optimizer.type",
                    "'" + type + "': FleetPS's optimizer is AdamW (DeepSpeed's Adam or AdamW)");
    }
    if (const nlohmann::json* mode = ds.Find("optimizer.params.adam_w_mode");
        mode != nullptr && mode->is_boolean() && !mode->get<bool>()) {
      return ds.Bad("optimizer.params.adam_w_mode",
                    "false (L2 in the gradient): FleetPS's Adam decays weights decoupled (AdamW)");
    }
    FLEET_ASSIGN_OR_RETURN(std::optional<double> lr, ds.Number("optimizer.params.lr"));
    if (lr) {
      t->Set("Optimizer.lr.max_lr", Num(*lr), ds.Source("optimizer.params.lr"));
      if (f.lr && *f.lr != *lr) {
        t->Note(absl::StrCat("DeepSpeed's optimizer lr ", *lr, " wins over --lr ", *f.lr));
      }
    }
    if (const nlohmann::json* betas = ds.Find("optimizer.params.betas")) {
      if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
          !(*betas)[1].is_number()) {
        return ds.Bad("optimizer.params.betas", "must be [beta1, beta2], got " + betas->dump());
      }
      t->Set("Optimizer.beta1", Num((*betas)[0].get<double>()),
             ds.Source("optimizer.params.betas"));
      t->Set("Optimizer.beta2", Num((*betas)[1].get<double>()),
             ds.Source("optimizer.params.betas"));
    }
    FLEET_ASSIGN_OR_RETURN(std::optional<double> eps, ds.Number("optimizer.params.eps"));
    if (eps) t->Set("Optimizer.epsilon", Num(*eps), ds.Source("optimizer.params.eps"));
    FLEET_ASSIGN_OR_RETURN(std::optional<double> wd, ds.Number("optimizer.params.weight_decay"));
    if (wd) t->Set("Optimizer.weight_decay", Num(*wd), ds.Source("optimizer.params.weight_decay"));
  }
  if (ds.Find("scheduler") != nullptr) {
    ds.Unknown("scheduler", {"type", "params"}, &unknown);
    ds.Unknown("scheduler.params",
               {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                "total_num_steps", "last_batch_iteration"},
               &unknown);
    FLEET_ASSIGN_OR_RETURN(std::string type, ds.String("scheduler.type"));
    if (type != "WarmupLR" && type != "WarmupDecayLR") {
      return ds.Bad("scheduler.type",
                    "'" + type + "': FleetPS runs DeepSpeed's WarmupLR and WarmupDecayLR");
    }
    const std::string src = ds.Source("scheduler");
    t->Set("Optimizer.lr.name", type, src);
    FLEET_ASSIGN_OR_RETURN(std::optional<double> min_lr,
                           ds.Number("scheduler.params.warmup_min_lr"));
    FLEET_ASSIGN_OR_RETURN(std::optional<double> max_lr,
                           ds.Number("scheduler.params.warmup_max_lr"));
    FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> warmup,
                           ds.Int("scheduler.params.warmup_num_steps", 0));
    FLEET_ASSIGN_OR_RETURN(std::string warmup_type, ds.String("scheduler.params.warmup_type"));
    FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> total,
                           ds.Int("scheduler.params.total_num_steps", 1));
    // DeepSpeed's defaults: 0, 0.001, 1000 steps, log.
    t->Set("Optimizer.lr.warmup_min_lr", Num(min_lr.value_or(0.0)), src);
    t->Set("Optimizer.lr.max_lr", Num(max_lr.value_or(0.001)), src);
    t->Set("Optimizer.lr.warmup_steps", std::to_string(warmup.value_or(1000)), src);
    t->Set("Optimizer.lr.warmup_type", warmup_type.empty() ? "log" : warmup_type, src);
    if (type == "WarmupDecayLR") {
      if (!total)
        return ds.Bad("scheduler.params.total_num_steps", "missing: WarmupDecayLR needs it");
      t->Set("Optimizer.lr.decay_steps", std::to_string(*total), src);
    } else {
      t->Set("Optimizer.lr.decay_steps",
             std::to_string(std::max<int64_t>(warmup.value_or(1000), *f.train_iters)), src);
    }
  }
  // Precision.
  FLEET_ASSIGN_OR_RETURN(bool fp16, ds.Bool("fp16.enabled"));
  FLEET_ASSIGN_OR_RETURN(bool bf16, ds.Bool("bf16.enabled"));
  ds.Unknown("fp16",
             {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
              "min_loss_scale"},
             &unknown);
  ds.Unknown("bf16", {"enabled"}, &unknown);
  if (fp16 && bf16) return ds.Bad("bf16.enabled", "true with fp16.enabled: pick one");
  if (bf16) {
    t->Set("Engine.mix_precision.enable", "True", ds.Source("bf16.enabled"));
    t->Set("Engine.mix_precision.dtype", "bfloat16", ds.Source("bf16.enabled"));
  }
  if (fp16) {
    const std::string src = ds.Source("fp16");
    t->Set("Engine.mix_precision.enable", "True", src);
    t->Set("Engine.mix_precision.dtype", "float16", src);
    FLEET_ASSIGN_OR_RETURN(std::optional<double> scale, ds.Number("fp16.loss_scale"));
    FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> power, ds.Int("fp16.initial_scale_power", 0));
    FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> window, ds.Int("fp16.loss_scale_window", 1));
    FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> hysteresis, ds.Int("fp16.hysteresis", 1));
    FLEET_ASSIGN_OR_RETURN(std::optional<double> min_scale, ds.Number("fp16.min_loss_scale"));
    const bool dynamic = !scale || *scale == 0;
    // DeepSpeed's defaults: 2^16 (initial_scale_power 16), 1000, 2, 1.
    t->Set("Engine.mix_precision.use_dynamic_loss_scaling", dynamic ? "True" : "False", src);
    t->Set("Engine.mix_precision.scale_loss",
           Num(dynamic ? std::ldexp(1.0, static_cast<int>(power.value_or(16))) : *scale), src);
    t->Set("Engine.mix_precision.incr_every_n_steps", std::to_string(window.value_or(1000)), src);
    t->Set("Engine.mix_precision.decr_every_n_nan_or_inf", std::to_string(hysteresis.value_or(2)),
           src);
    t->Set("Engine.mix_precision.min_loss_scale", Num(min_scale.value_or(1.0)), src);
  }
  // ZeRO: sharding over the data-parallel ranks.
  ds.Unknown("zero_optimization",
             {"stage", "offload_optimizer", "offload_param", "cpu_offload", "reduce_bucket_size",
              "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
              "allgather_partitions", "reduce_scatter"},
             &unknown);
  FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> stage, ds.Int("zero_optimization.stage", 0));
  if (stage && *stage > 3) return ds.Bad("zero_optimization.stage", "must be 0, 1, 2 or 3");
  FLEET_ASSIGN_OR_RETURN(bool cpu_offload, ds.Bool("zero_optimization.cpu_offload"));
  FLEET_ASSIGN_OR_RETURN(std::string offload_device,
                         ds.String("zero_optimization.offload_optimizer.device"));
  FLEET_ASSIGN_OR_RETURN(std::string param_device,
                         ds.String("zero_optimization.offload_param.device"));
  if (!param_device.empty() && param_device != "none") {
    return ds.Bad("zero_optimization.offload_param.device",
                  "'" + param_device +
                      "': FleetPS keeps parameters on the device (it offloads the optimizer: "
                      "offload_optimizer)");
  }
  const bool offload = cpu_offload || offload_device == "cpu" || f.cpu_optimizer;
  if (!offload_device.empty() && offload_device != "cpu" && offload_device != "none") {
    return ds.Bad("zero_optimization.offload_optimizer.device",
                  "'" + offload_device + "': cpu or none (NVMe offload is not built)");
  }
  const int64_t zero = stage.value_or(0);
  if (zero > 0 && dp_world > 1) {
    t->Set("Distributed.dp_degree", "1", ds.Source("zero_optimization.stage"));
    t->Set("Distributed.sharding.sharding_degree", std::to_string(dp_world),
           ds.Source("zero_optimization.stage"));
    t->Set("Distributed.sharding.sharding_stage", std::to_string(zero),
           ds.Source("zero_optimization.stage"));
  }
  if (offload) {
    if (zero == 0) {
      return Status::InvalidArgument(
          "DeepSpeed's CPU optimizer runs with ZeRO: give zero_optimization.stage 1, 2 or 3",
          f.cpu_optimizer ? "--cpu-optimizer" : ds.path());
    }
    t->Set("Distributed.sharding.sharding_offload", "True",
           f.cpu_optimizer ? "--cpu-optimizer" : ds.Source("zero_optimization"));
  }
  FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> bucket,
                         ds.Int("zero_optimization.reduce_bucket_size", 1));
  if (bucket) {
    t->Set("Distributed.reduce_bucket_size", std::to_string(*bucket),
           ds.Source("zero_optimization.reduce_bucket_size"));
  }
  std::vector<std::string> fixed;
  for (std::string_view key : {"allgather_bucket_size", "overlap_comm", "contiguous_gradients",
                               "allgather_partitions", "reduce_scatter"}) {
    if (ds.Find(absl::StrCat("zero_optimization.", std::string(key))) != nullptr) {
      fixed.emplace_back(key);
    }
  }
  if (!fixed.empty()) {
    t->Note(absl::StrCat("zero_optimization.", absl::StrJoin(fixed, ", "),
                         ": accepted; FleetPS all-gathers by the reduce buckets, overlaps "
                         "communication with backward where it can and keeps gradients in one "
                         "arena, whatever they say"));
  }
  // Activation checkpointing's placement options.
  ds.Unknown("activation_checkpointing",
             {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
              "number_checkpoints", "synchronize_checkpoint_boundary", "profile"},
             &unknown);
  if (ds.Find("activation_checkpointing") != nullptr) {
    t->Note(
        "activation_checkpointing: accepted; with --checkpoint-activations FleetPS keeps each "
        "block's input whole on the device (partitioning it over model-parallel ranks or moving "
        "it to the host is not built)");
  }
  FLEET_ASSIGN_OR_RETURN(std::optional<int64_t> steps_per_print, ds.Int("steps_per_print", 1));
  if (steps_per_print && !f.log_interval) {
    t->Set("Engine.logging_freq", std::to_string(*steps_per_print), ds.Source("steps_per_print"));
  }
  FLEET_ASSIGN_OR_RETURN(bool breakdown, ds.Bool("wall_clock_breakdown"));
  if (breakdown) {
    t->Set("Engine.wall_clock_breakdown", "True", ds.Source("wall_clock_breakdown"));
  }
  for (const std::string& key : unknown) {
    t->Note(absl::StrCat("warning: DeepSpeed key '", key, "' in ", ds.path(),
                         " is not understood; ignored"));
  }
  return Status::OK();
}

}  // namespace

bool IsMegatronFlag(std::string_view name) { return FindFlag(name) != nullptr; }

bool IsMegatronCommandLine(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (!a.starts_with("--")) continue;
    const std::string name = a.substr(2, a.find('=') - 2);
    if (IsMegatronFlag(name)) return true;
  }
  return false;
}

namespace {

// The Megatron flags of `args` into *f, everything else into *rest.
Status ReadFlags(const std::vector<std::string>& args, Flags* f, std::vector<std::string>* rest) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.starts_with("--") ? arg.substr(2, eq - 2) : "";
    const FlagSpec* spec = name.empty() ? nullptr : FindFlag(name);
    if (spec == nullptr) {
      rest->push_back(arg);  // the program's own (or a stray argument: the program says)
      continue;
    }
    if (IsSwitch(*spec)) {
      if (eq != std::string::npos) {
        return Status::InvalidArgument("takes no value", FlagText(spec->name));
      }
      FLEET_RETURN_IF_ERROR(SetFlag(*spec, "", f));
      continue;
    }
    if (eq != std::string::npos) {
      FLEET_RETURN_IF_ERROR(SetFlag(*spec, arg.substr(eq + 1), f));
      continue;
    }
    if (i + 1 >= args.size() || args[i + 1].starts_with("--")) {
      return Status::InvalidArgument("needs a value", FlagText(spec->name));
    }
    // A list (--train-data a.json b.json) takes every value up to the next flag.
    do {
      FLEET_RETURN_IF_ERROR(SetFlag(*spec, args[++i], f));
    } while (IsList(*spec) && i + 1 < args.size() && !args[i + 1].starts_with("-"));
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<std::string>> NonMegatronArgs(const std::vector<std::string>& args) {
  Flags f;
  std::vector<std::string> rest;
  FLEET_RETURN_IF_ERROR(ReadFlags(args, &f, &rest));
  return rest;
}

Result<MegatronCommand> ParseMegatronCommandLine(const std::vector<std::string>& args,
                                                 const MegatronTarget& target) {
  Flags f;
  MegatronCommand out;
  FLEET_RETURN_IF_ERROR(ReadFlags(args, &f, &out.rest));
  if (f.deepspeed != f.deepspeed_config.has_value()) {
    return Status::InvalidArgument("--deepspeed and --deepspeed_config FILE go together",
                                   f.deepspeed ? "--deepspeed_config" : "--deepspeed");
  }
  const int64_t mp = f.model_parallel_size.value_or(1);
  if (mp < 1 || target.world_size % mp != 0) {
    return Status::InvalidArgument(
        absl::StrCat(mp, " does not divide the job's ", target.world_size, " ranks"),
        "--model-parallel-size");
  }
  const int64_t dp_world = target.world_size / mp;
  std::optional<DeepSpeedConfig> ds;
  if (f.deepspeed_config) {
    FLEET_ASSIGN_OR_RETURN(DeepSpeedConfig loaded, DeepSpeedConfig::Load(*f.deepspeed_config));
    ds.emplace(std::move(loaded));
  } else if (f.cpu_optimizer) {
    return Status::InvalidArgument(
        "DeepSpeed's CPU optimizer runs with ZeRO: give --deepspeed --deepspeed_config with "
        "zero_optimization",
        "--cpu-optimizer");
  }
  Translation t;
  FLEET_RETURN_IF_ERROR(TranslateModelAndData(f, target, &t));
  FLEET_RETURN_IF_ERROR(TranslateEngine(f, &t));
  FLEET_RETURN_IF_ERROR(TranslateOptimizer(f, &t));
  FLEET_RETURN_IF_ERROR(TranslateBatches(f, ds ? &*ds : nullptr, dp_world, &t));
  if (ds) FLEET_RETURN_IF_ERROR(TranslateDeepSpeed(f, *ds, dp_world, &t));
  if (!f.lr && (!ds || (ds->Find("optimizer.params.lr") == nullptr && !ds->Find("scheduler")))) {
    return Status::InvalidArgument("missing: Megatron requires it", "--lr");
  }

  FLEET_ASSIGN_OR_RETURN(ConfigDocument doc,
                         ConfigDocument::FromString(kMegatronDefaults, "Megatron's defaults"));
  for (const auto& [assignment, source] : t.assignments()) {
    Status st = doc.Override(assignment);
    if (!st.ok()) return Status::InvalidArgument(st.message(), source);
  }
  Result<GptJobConfig> config = ParseGptJobConfig(std::move(doc), target.world_size);
  if (!config.ok()) {
    // Name the flag or JSON key behind the "-o Key=value" the error cites.
    std::string message = config.status().message();
    for (const auto& [assignment, source] : t.assignments()) {
      const std::string cited = "-o " + assignment;
      if (const size_t at = message.find(cited); at != std::string::npos) {
        message.replace(at, cited.size(), source);
        break;
      }
    }
    return Status::InvalidArgument(message);
  }
  out.config = std::move(config).value();
  out.notes = std::move(t.notes());
  return out;
}

}  // namespace fleet::trainer::config
