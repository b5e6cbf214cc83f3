#include "collective/config/gpt_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace fleet::trainer::config {

std::string_view DeviceName(Device d) { return d == Device::kCpu ? "cpu" : "gpu"; }

std::string_view DatasetKindName(DatasetKind k) {
  switch (k) {
    case DatasetKind::kFleetX:
      return "GPTDataset";
    case DatasetKind::kTokenBin:
      return "TokenBinDataset";
    case DatasetKind::kText:
      return "TextDataset";
    case DatasetKind::kPromptResponse:
      return "PromptResponseDataset";
    case DatasetKind::kMegatron:
      return "MegatronGPTDataset";
  }
  return "unknown";
}

namespace {

// A FleetX feature FleetPS lacks: the key is accepted only when false.
Status OffOnly(ConfigSection& s, std::string_view key, std::string_view why) {
  bool on = false;
  FLEET_RETURN_IF_ERROR(s.Bool(key, &on));
  if (on) return s.Error(key, "must be false: " + std::string(why));
  return Status::OK();
}

// A list-valued FleetX option accepted only when empty.
Status EmptyOnly(ConfigSection& s, std::string_view key, std::string_view why) {
  if (s.Has(key)) return s.Error(key, "must be empty: " + std::string(why));
  s.Accept(key);
  return Status::OK();
}

struct Batch {
  std::optional<int64_t> global, local;
  int64_t micro = 1;
};

Status ParseGlobal(ConfigSection s, GlobalConfig* g, Batch* b) {
  std::string device = "gpu";
  FLEET_RETURN_IF_ERROR(s.Choice("device", &device, {"cpu", "gpu"}));
  g->device = device == "cpu" ? Device::kCpu : Device::kGpu;
  FLEET_RETURN_IF_ERROR(s.Int("seed", &g->seed, 0));
  FLEET_RETURN_IF_ERROR(s.OptionalInt("global_batch_size", &b->global, 1));
  FLEET_RETURN_IF_ERROR(s.OptionalInt("local_batch_size", &b->local, 1));
  FLEET_RETURN_IF_ERROR(s.Int("micro_batch_size", &b->micro, 1));
  return s.Finish();
}

Status ParseMixPrecision(ConfigSection s, MixPrecisionConfig* m) {
  bool pure_fp16 = false, enable = false;
  std::string dtype, level = "O2";
  FLEET_RETURN_IF_ERROR(s.Bool("use_pure_fp16", &pure_fp16));
  FLEET_RETURN_IF_ERROR(s.Bool("enable", &enable));
  FLEET_RETURN_IF_ERROR(s.Choice("dtype", &dtype, {"float32", "float16", "bfloat16"}));
  FLEET_RETURN_IF_ERROR(s.Choice("level", &level, {"O1", "O2"}));
  FLEET_RETURN_IF_ERROR(s.Double("scale_loss", &m->scale_loss, 1e-30, 1e30));
  FLEET_RETURN_IF_ERROR(s.Bool("use_dynamic_loss_scaling", &m->dynamic_loss_scaling));
  FLEET_RETURN_IF_ERROR(s.Int("incr_every_n_steps", &m->incr_every_n_steps, 1));
  FLEET_RETURN_IF_ERROR(s.Int("decr_every_n_nan_or_inf", &m->decr_every_n_nan_or_inf, 1));
  FLEET_RETURN_IF_ERROR(s.Double("min_loss_scale", &m->min_loss_scale, 1e-30, 1e30));
  if (m->min_loss_scale > m->scale_loss) {
    return s.Error("min_loss_scale",
                   absl::StrCat(m->min_loss_scale, " is above scale_loss ", m->scale_loss));
  }
  s.Accept("custom_black_list");
  s.Accept("custom_white_list");
  const Precision asked = !enable              ? Precision::kFp32
                          : dtype == "float16" ? Precision::kFp16
                          : dtype == "float32" ? Precision::kFp32
                                               : Precision::kBf16;
  if (s.Has("use_pure_fp16")) {
    // FleetX's older key decides; the newer ones may agree with it.
    const Precision pure = pure_fp16 ? Precision::kFp16 : Precision::kFp32;
    if (enable && asked != pure) {
      return s.Error("use_pure_fp16",
                     absl::StrCat(pure_fp16 ? "true asks for float16" : "false asks for float32",
                                  " while enable/dtype ask for ",
                                  dtype.empty() ? "bfloat16" : dtype, "; set only one"));
    }
    m->precision = pure;
  } else {
    m->precision = asked;
  }
  return s.Finish();
}

Status ParseEngine(ConfigSection s, EngineConfig* e, std::optional<int64_t>* accumulate,
                   std::optional<int64_t>* test_iters) {
  FLEET_RETURN_IF_ERROR(s.Int("max_steps", &e->max_steps, 1));
  FLEET_RETURN_IF_ERROR(s.Int("num_train_epochs", &e->num_train_epochs, 1));
  FLEET_RETURN_IF_ERROR(s.OptionalInt("accumulate_steps", accumulate, 1));
  FLEET_RETURN_IF_ERROR(s.Int("logging_freq", &e->logging_freq, 1));
  FLEET_RETURN_IF_ERROR(s.Int("eval_freq", &e->eval_freq));
  FLEET_RETURN_IF_ERROR(s.Int("eval_iters", &e->eval_iters, 0));
  FLEET_RETURN_IF_ERROR(s.OptionalInt("test_iters", test_iters, 0));
  FLEET_RETURN_IF_ERROR(s.Bool("dry_run", &e->dry_run));
  FLEET_RETURN_IF_ERROR(s.Bool("wall_clock_breakdown", &e->wall_clock_breakdown));
  std::string mode = "pretrain";
  FLEET_RETURN_IF_ERROR(s.Choice("mode", &mode, {"pretrain", "finetune"}));
  e->mode = mode == "finetune" ? EngineMode::kFinetune : EngineMode::kPretrain;
  FLEET_RETURN_IF_ERROR(s.String("init_from", &e->init_from));
  FLEET_RETURN_IF_ERROR(s.Bool("tensorboard", &e->tensorboard));
  FLEET_RETURN_IF_ERROR(ParseMixPrecision(s.Sub("mix_precision"), &e->mix_precision));

  ConfigSection sl = s.Sub("save_load");
  int64_t save_steps = -1;
  FLEET_RETURN_IF_ERROR(sl.Int("save_steps", &save_steps, -1));
  if (save_steps == 0) return sl.Error("save_steps", "must be >= 1, or -1 (never)");
  if (save_steps > 0) e->save_load.save_steps = save_steps;
  int64_t save_epoch = -1;
  FLEET_RETURN_IF_ERROR(sl.Int("save_epoch", &save_epoch, -1));
  if (save_epoch == 0) return sl.Error("save_epoch", "must be >= 1, or -1 (every epoch)");
  e->save_load.save_epoch = save_epoch > 0 ? save_epoch : 1;
  FLEET_RETURN_IF_ERROR(sl.String("output_dir", &e->save_load.output_dir));
  if (e->save_load.output_dir.empty()) return sl.Error("output_dir", "must not be empty");
  FLEET_RETURN_IF_ERROR(sl.String("ckpt_dir", &e->save_load.ckpt_dir));
  FLEET_RETURN_IF_ERROR(sl.Finish());
  return s.Finish();
}

// A dropout probability: in [0, 1) (1 would drop everything).
Status DropoutProb(ConfigSection& s, std::string_view key, float* out) {
  double p = 0;
  FLEET_RETURN_IF_ERROR(s.Double(key, &p, 0, 1));
  if (p >= 1) return s.Error(key, absl::StrCat("must be below 1 (1 drops every element); got ", p));
  *out = static_cast<float>(p);
  return Status::OK();
}

// Model.lora: rank (required), alpha (default: rank), dropout (0 only),
// targets (default all four).
Status ParseLora(ConfigSection s, const GptConfig& model, GptLoraConfig* lora) {
  if (!s.Has("rank")) {
    return s.Error("rank", "is required with Model.lora (the adapters' rank, e.g. 8)");
  }
  FLEET_RETURN_IF_ERROR(s.Int("rank", &lora->rank, 1, 1 << 20));
  if (lora->rank > model.hidden_size) {
    return s.Error("rank", absl::StrCat(lora->rank, " exceeds Model.hidden_size ",
                                        model.hidden_size, ": a low rank is the point of LoRA"));
  }
  double alpha = lora->rank;
  FLEET_RETURN_IF_ERROR(s.Double("alpha", &alpha, 1e-6, 1e6));
  lora->alpha = static_cast<float>(alpha);
  double dropout = 0;
  FLEET_RETURN_IF_ERROR(s.Double("dropout", &dropout, 0, 1));
  if (dropout != 0) {
    return s.Error("dropout", absl::StrCat("must be 0: FleetPS's LoRA has no dropout on the "
                                           "adapters' input (not implemented); got ",
                                           dropout));
  }
  std::vector<std::string> targets = {"qkv", "proj", "fc", "fc_proj"};
  FLEET_RETURN_IF_ERROR(s.ChoiceList("targets", &targets, {"qkv", "proj", "fc", "fc_proj"}));
  lora->targets = {};
  for (const std::string& t : targets) {
    const LoraTarget target = t == "qkv"    ? LoraTarget::kQkv
                              : t == "proj" ? LoraTarget::kProj
                              : t == "fc"   ? LoraTarget::kFc
                                            : LoraTarget::kFcProj;
    lora->targets[static_cast<size_t>(target)] = true;
  }
  return s.Finish();
}

Status ParseModel(ConfigSection s, GptConfig* m, std::optional<int64_t>* vocab_unit) {
  s.Accept("module");
  std::string name = "GPT";
  FLEET_RETURN_IF_ERROR(s.Choice("name", &name, {"GPT"}));
  FLEET_RETURN_IF_ERROR(s.Int("vocab_size", &m->vocab_size, 1, INT32_MAX));
  FLEET_RETURN_IF_ERROR(s.Int("hidden_size", &m->hidden_size, 1, 1 << 20));
  FLEET_RETURN_IF_ERROR(s.Int("num_layers", &m->num_layers, 1, 1 << 16));
  FLEET_RETURN_IF_ERROR(s.Int("num_attention_heads", &m->num_attention_heads, 1, 1 << 16));
  FLEET_RETURN_IF_ERROR(s.Int("ffn_hidden_size", &m->ffn_hidden_size, 0, 1 << 22));
  FLEET_RETURN_IF_ERROR(DropoutProb(s, "hidden_dropout_prob", &m->hidden_dropout_prob));
  FLEET_RETURN_IF_ERROR(
      DropoutProb(s, "attention_probs_dropout_prob", &m->attention_probs_dropout_prob));
  FLEET_RETURN_IF_ERROR(s.Int("max_position_embeddings", &m->max_position_embeddings, 1, 1 << 22));
  int64_t type_vocab_size = 16;
  FLEET_RETURN_IF_ERROR(s.Int("type_vocab_size", &type_vocab_size, 0));
  double init = m->initializer_range;
  FLEET_RETURN_IF_ERROR(s.Double("initializer_range", &init, 1e-12, 10));
  m->initializer_range = static_cast<float>(init);
  FLEET_RETURN_IF_ERROR(s.Bool("use_recompute", &m->use_recompute));
  std::string granularity = "full";
  FLEET_RETURN_IF_ERROR(s.Choice("recompute_granularity", &granularity, {"full"}));
  FLEET_RETURN_IF_ERROR(EmptyOnly(s, "recompute_layers", "FleetPS recomputes every block"));
  FLEET_RETURN_IF_ERROR(EmptyOnly(s, "no_recompute_layers", "FleetPS recomputes every block"));
  FLEET_RETURN_IF_ERROR(s.OptionalInt("vocab_size_divisible_unit", vocab_unit, 1, 1 << 20));
  // Kernel choices of FleetX that compute the same function here: fused
  // GEMMs, the scores' scaling by the layer count (q / (L sqrt(hs)), then
  // x L: the same scores), flash attention and the fused causal softmax.
  bool same_math = false;
  for (std::string_view key : {"fused_linear", "fuse_attn_qkv", "scale_qk_by_layer_num",
                               "use_flash_attn", "fused_softmax_with_triangular"}) {
    FLEET_RETURN_IF_ERROR(s.Bool(key, &same_math));
  }
  FLEET_RETURN_IF_ERROR(
      OffOnly(s, "sequence_parallel", "FleetPS has no tensor or sequence parallelism"));
  if (m->hidden_size % m->num_attention_heads != 0) {
    return s.Error("hidden_size",
                   absl::StrCat(m->hidden_size, " is not a multiple of num_attention_heads ",
                                m->num_attention_heads));
  }
  ConfigSection lora = s.Sub("lora");
  if (lora.present()) FLEET_RETURN_IF_ERROR(ParseLora(lora, *m, &m->lora));
  FLEET_RETURN_IF_ERROR(s.Finish());
  // The model's own check; everything it refuses was refused above with the
  // key's file, so this guards only against the two drifting apart.
  return m->Validate();
}

Status ParseDataSplit(ConfigSection s, DataSplitConfig* d) {
  d->present = s.present();
  ConfigSection ds = s.Sub("dataset");
  DatasetConfig& c = d->dataset;
  std::string name = "GPTDataset";
  FLEET_RETURN_IF_ERROR(ds.Choice("name", &name,
                                  {"GPTDataset", "TokenBinDataset", "TextDataset",
                                   "PromptResponseDataset", "MegatronGPTDataset"}));
  c.kind = name == "GPTDataset"           ? DatasetKind::kFleetX
           : name == "TokenBinDataset"    ? DatasetKind::kTokenBin
           : name == "TextDataset"        ? DatasetKind::kText
           : name == "MegatronGPTDataset" ? DatasetKind::kMegatron
                                          : DatasetKind::kPromptResponse;
  FLEET_RETURN_IF_ERROR(ds.String("input_dir", &c.input_dir));
  FLEET_RETURN_IF_ERROR(ds.String("input_files", &c.input_files));
  if (!c.input_dir.empty() && !c.input_files.empty()) {
    return ds.Error("input_files", "give input_dir or input_files, not both");
  }
  if (c.input_dir.empty() && c.input_files.empty() && c.kind != DatasetKind::kText && d->present) {
    return ds.Error("input_dir", absl::StrCat(name, " needs input_dir or input_files"));
  }
  FLEET_RETURN_IF_ERROR(ds.DoubleList("split", &c.split, 1, 3, 0, 1e12));
  while (c.split.size() < 3) c.split.push_back(0);
  if (c.split[0] + c.split[1] + c.split[2] <= 0) {
    return ds.Error("split", "the weights must not all be 0");
  }
  FLEET_RETURN_IF_ERROR(ds.Int("max_seq_len", &c.max_seq_len, 1, 1 << 22));
  FLEET_RETURN_IF_ERROR(ds.Choice("tokenizer", &c.tokenizer, {"gpt2", "byte"}));
  FLEET_RETURN_IF_ERROR(ds.String("vocab_dir", &c.vocab_dir));
  FLEET_RETURN_IF_ERROR(ds.String("vocab_file", &c.vocab_file));
  FLEET_RETURN_IF_ERROR(ds.String("merge_file", &c.merge_file));
  if (c.vocab_file.empty() != c.merge_file.empty()) {
    return ds.Error(c.vocab_file.empty() ? "vocab_file" : "merge_file",
                    "missing: vocab_file and merge_file go together");
  }
  if (!c.vocab_file.empty() && !c.vocab_dir.empty()) {
    return ds.Error("vocab_file", "give vocab_dir or vocab_file + merge_file, not both");
  }
  FLEET_RETURN_IF_ERROR(
      ds.Choice("text_format", &c.text_format, {"file", "line", "blank_line", "percent", "jsonl"}));
  FLEET_RETURN_IF_ERROR(ds.String("cache_dir", &c.cache_dir));
  if (c.cache_dir.empty()) return ds.Error("cache_dir", "must not be empty");
  FLEET_RETURN_IF_ERROR(ds.Finish());

  ConfigSection sampler = s.Sub("sampler");
  std::string sampler_name = "GPTBatchSampler";
  FLEET_RETURN_IF_ERROR(
      sampler.Choice("name", &sampler_name, {"GPTBatchSampler", "DistributedBatchSampler"}));
  bool shuffle = true, drop_last = true;
  FLEET_RETURN_IF_ERROR(sampler.Bool("shuffle", &shuffle));
  FLEET_RETURN_IF_ERROR(sampler.Bool("drop_last", &drop_last));
  if (!drop_last) {
    return sampler.Error("drop_last", "must be true: the last partial global batch is dropped");
  }
  FLEET_RETURN_IF_ERROR(sampler.Finish());

  ConfigSection loader = s.Sub("loader");
  int64_t workers = 0;
  FLEET_RETURN_IF_ERROR(loader.Int("num_workers", &workers, 0));
  loader.Accept("return_list");
  loader.Accept("collate_fn");
  FLEET_RETURN_IF_ERROR(loader.Finish());
  return s.Finish();
}

Status ParseData(ConfigSection s, DataConfig* d) {
  FLEET_RETURN_IF_ERROR(ParseDataSplit(s.Sub("Train"), &d->train));
  FLEET_RETURN_IF_ERROR(ParseDataSplit(s.Sub("Eval"), &d->eval));
  FLEET_RETURN_IF_ERROR(ParseDataSplit(s.Sub("Test"), &d->test));
  if (!d->train.present) return s.Error("Train", "missing: the training data section");
  return s.Finish();
}

Status ParseOptimizer(ConfigSection s, AdamWConfig* o, LrScheduleConfig* schedule,
                      bool* use_increments) {
  std::string name = "AdamW";
  FLEET_RETURN_IF_ERROR(s.Choice("name", &name, {"AdamW", "FusedAdamW"}));
  FLEET_RETURN_IF_ERROR(s.Float("weight_decay", &o->weight_decay, 0, 1e3));
  FLEET_RETURN_IF_ERROR(s.Float("beta1", &o->beta1, 0, 0.999999));
  FLEET_RETURN_IF_ERROR(s.Float("beta2", &o->beta2, 0, 0.999999999));
  FLEET_RETURN_IF_ERROR(s.Float("epsilon", &o->eps, 1e-30, 1));
  bool fusion = false;
  FLEET_RETURN_IF_ERROR(s.Bool("tensor_fusion", &fusion));

  ConfigSection lr = s.Sub("lr");
  std::string lr_name = "CosineAnnealingWithWarmupDecay";
  FLEET_RETURN_IF_ERROR(
      lr.Choice("name", &lr_name,
                {"CosineAnnealingWithWarmupDecay", "LinearAnnealingWithWarmupDecay",
                 "ConstantWithWarmup", "WarmupLR", "WarmupDecayLR"}));
  const bool deepspeed = lr_name == "WarmupLR" || lr_name == "WarmupDecayLR";
  schedule->decay = lr_name == "CosineAnnealingWithWarmupDecay"   ? LrDecay::kCosine
                    : lr_name == "LinearAnnealingWithWarmupDecay" ? LrDecay::kLinear
                    : lr_name == "WarmupDecayLR"                  ? LrDecay::kLinear
                                                                  : LrDecay::kConstant;
  FLEET_RETURN_IF_ERROR(lr.Bool("use_increments", use_increments));
  schedule->max_lr = 5e-5f;  // FleetX's base, the default documented above
  FLEET_RETURN_IF_ERROR(lr.Float("max_lr", &schedule->max_lr, 1e-30, 100));
  FLEET_RETURN_IF_ERROR(lr.Float("min_lr", &schedule->min_lr, 0, 100));
  FLEET_RETURN_IF_ERROR(lr.Int("decay_steps", &schedule->decay_steps, 1));
  double warmup_rate = 0.01;
  FLEET_RETURN_IF_ERROR(lr.Double("warmup_rate", &warmup_rate, 0, 1));
  schedule->warmup_steps = std::llround(warmup_rate * static_cast<double>(schedule->decay_steps));
  std::optional<int64_t> warmup_steps;
  FLEET_RETURN_IF_ERROR(lr.OptionalInt("warmup_steps", &warmup_steps, 0));
  if (warmup_steps) {
    if (*warmup_steps > schedule->decay_steps) {
      return lr.Error("warmup_steps",
                      absl::StrCat(*warmup_steps, " is above decay_steps ", schedule->decay_steps));
    }
    schedule->warmup_steps = *warmup_steps;
  }
  FLEET_RETURN_IF_ERROR(lr.Float("warmup_min_lr", &schedule->warmup_min_lr, 0, 100));
  std::string warmup_type = deepspeed ? "log" : "linear";
  FLEET_RETURN_IF_ERROR(lr.Choice("warmup_type", &warmup_type, {"linear", "log"}));
  if (!deepspeed && (lr.Has("warmup_min_lr") || lr.Has("warmup_type"))) {
    return lr.Error(lr.Has("warmup_type") ? "warmup_type" : "warmup_min_lr",
                    "is DeepSpeed's; it takes name WarmupLR or WarmupDecayLR");
  }
  if (deepspeed) {
    schedule->warmup = warmup_type == "log" ? LrWarmup::kLog : LrWarmup::kLinearMin;
    // DeepSpeed's WarmupDecayLR decays to where its warmup started.
    schedule->min_lr = std::min(schedule->warmup_min_lr, schedule->max_lr);
  }
  if (schedule->min_lr > schedule->max_lr) {
    return lr.Error("min_lr",
                    absl::StrCat(schedule->min_lr, " is above max_lr ", schedule->max_lr));
  }
  if (schedule->warmup_min_lr > schedule->max_lr) {
    return lr.Error("warmup_min_lr",
                    absl::StrCat(schedule->warmup_min_lr, " is above max_lr ", schedule->max_lr));
  }
  FLEET_RETURN_IF_ERROR(lr.Finish());

  ConfigSection clip = s.Sub("grad_clip");
  std::string clip_name = "ClipGradByGlobalNorm";
  FLEET_RETURN_IF_ERROR(clip.Choice("name", &clip_name, {"ClipGradByGlobalNorm"}));
  FLEET_RETURN_IF_ERROR(clip.Float("clip_norm", &o->clip_norm, 0, 1e30));
  FLEET_RETURN_IF_ERROR(clip.Finish());
  FLEET_RETURN_IF_ERROR(s.Finish());
  // The optimizer's own checks; everything they refuse was refused above
  // with the key's file, so these guard only against drift.
  FLEET_RETURN_IF_ERROR(o->Validate());
  return schedule->Validate();
}

Status ParseDistributed(ConfigSection s, DistributedConfig* d, std::optional<int64_t>* dp) {
  FLEET_RETURN_IF_ERROR(s.OptionalInt("dp_degree", dp, 1));
  FLEET_RETURN_IF_ERROR(s.Int("mp_degree", &d->mp_degree, 1));
  FLEET_RETURN_IF_ERROR(s.Int("reduce_bucket_size", &d->reduce_bucket_size, 0, int64_t{1} << 40));
  FLEET_RETURN_IF_ERROR(s.Int("pp_degree", &d->pp_degree, 1));
  FLEET_RETURN_IF_ERROR(
      OffOnly(s, "fuse_sequence_parallel_allreduce", "FleetPS has no sequence parallelism"));
  ConfigSection sh = s.Sub("sharding");
  FLEET_RETURN_IF_ERROR(sh.Int("sharding_degree", &d->sharding_degree, 1));
  FLEET_RETURN_IF_ERROR(sh.Int("sharding_stage", &d->sharding_stage, 1, 3));
  FLEET_RETURN_IF_ERROR(sh.Bool("sharding_offload", &d->sharding_offload));
  bool overlap = false;
  FLEET_RETURN_IF_ERROR(sh.Bool("reduce_overlap", &overlap));
  FLEET_RETURN_IF_ERROR(sh.Bool("broadcast_overlap", &overlap));
  FLEET_RETURN_IF_ERROR(sh.Finish());
  return s.Finish();
}

Status ParseGeneration(ConfigSection s, GenerationConfig* g) {
  FLEET_RETURN_IF_ERROR(
      s.Choice("decode_strategy", &g->decode_strategy, {"sampling", "greedy_search"}));
  FLEET_RETURN_IF_ERROR(s.Int("top_k", &g->top_k, 0));
  FLEET_RETURN_IF_ERROR(s.Double("top_p", &g->top_p, 1e-9, 1));
  FLEET_RETURN_IF_ERROR(s.Double("temperature", &g->temperature, 0, 1e6));
  FLEET_RETURN_IF_ERROR(s.Int("min_dec_len", &g->min_dec_len, 0));
  FLEET_RETURN_IF_ERROR(s.Int("max_dec_len", &g->max_dec_len, 1));
  FLEET_RETURN_IF_ERROR(s.Int("num_return_sequences", &g->num_return_sequences, 1));
  if (g->max_dec_len < g->min_dec_len) {
    return s.Error("max_dec_len",
                   absl::StrCat(g->max_dec_len, " is below min_dec_len ", g->min_dec_len));
  }
  return s.Finish();
}

Status ParseProfiler(ConfigSection s) {
  FLEET_RETURN_IF_ERROR(OffOnly(s, "enable", "FleetPS has no Paddle profiler"));
  s.Accept("scheduler");
  s.Accept("profiler_log");
  s.Accept("detailed");
  return s.Finish();
}

Status ParseFused(ConfigSection s) {
  bool fusion = false;
  FLEET_RETURN_IF_ERROR(s.Bool("tensor_fusion", &fusion));
  return s.Finish();
}

bool FromOverride(const ConfigDocument& doc, std::string_view key) {
  return doc.SourceOf(key).starts_with("-o ");
}

// The overrides that make a config written for other degrees run on
// `world_size` ranks with its global batch (or, where that cannot divide,
// its local batch): what one message lists instead of one error at a time.
std::string OverridesFor(int64_t world_size, const DistributedConfig& d, const Batch& b,
                         int64_t written_global, bool accumulate_given) {
  const int64_t dp = world_size / (d.sharding_degree * d.mp_degree * d.pp_degree);
  const int64_t data_world = dp * d.sharding_degree;
  std::string out = absl::StrCat("-o Distributed.dp_degree=", dp);
  if (written_global % data_world == 0 && (written_global / data_world) % b.micro == 0) {
    if (b.local) absl::StrAppend(&out, " -o Global.local_batch_size=", written_global / data_world);
  } else if (b.global) {
    const int64_t local = b.local.value_or(b.micro);
    absl::StrAppend(&out, " -o Global.global_batch_size=", local * data_world);
  }
  if (accumulate_given) absl::StrAppend(&out, " -o Engine.accumulate_steps=null");
  return out;
}

// FleetX's process_dist_config + process_global_configs, with errors
// instead of warnings and silent adjustments. One adjustment FleetX lacks: a
// config file written for more data-parallel ranks than the job has (a dp8
// config on one GPU) runs on the job's ranks with the same global batch,
// through more gradient accumulation, and says so in c->notes. What a user
// set on the command line is never adjusted.
Status Resolve(const ConfigDocument& doc, int64_t world_size, std::optional<int64_t> dp,
               const Batch& b, std::optional<int64_t> accumulate, GptJobConfig* c) {
  DistributedConfig& d = c->distributed;
  // Ranks of one data replica: pp x sharding x mp.
  const int64_t inner = d.pp_degree * d.sharding_degree * d.mp_degree;
  std::string inner_text = absl::StrCat("sharding_degree ", d.sharding_degree);
  if (d.pp_degree > 1) inner_text = absl::StrCat("pp_degree ", d.pp_degree, " x ", inner_text);
  if (d.mp_degree > 1) absl::StrAppend(&inner_text, " x mp_degree ", d.mp_degree);
  if (world_size == 0) world_size = dp.value_or(1) * inner;
  // The data-parallel degree the batch sizes were written for.
  int64_t written_dp = dp.value_or(world_size / inner);
  bool fewer_ranks = false;
  if (world_size % inner != 0) {
    return doc.Error("Distributed.sharding.sharding_degree",
                     absl::StrCat(inner_text, " does not divide the job's ", world_size, " ranks"));
  }
  if (dp && *dp * inner != world_size) {
    fewer_ranks = world_size < *dp * inner && !FromOverride(doc, "Distributed.dp_degree");
    if (!fewer_ranks) {
      const int64_t written_global = b.global.value_or(b.local.value_or(b.micro) * *dp *
                                                       d.sharding_degree);
      return doc.Error(
          "Distributed.dp_degree",
          absl::StrCat(*dp, " x ", inner_text, " = ", *dp * inner, " ranks, but the job has ",
                       world_size, "; to run on ", world_size, " ranks give ",
                       OverridesFor(world_size, d, b, written_global, accumulate.has_value()),
                       " (or leave dp_degree empty to derive it)"));
    }
  }
  d.dp_degree = world_size / inner;

  GlobalConfig& g = c->global;
  const int64_t data_world = c->data_world_size();
  const int64_t written_data_world = written_dp * d.sharding_degree;
  const std::string degrees =
      absl::StrCat("dp_degree ", written_dp, " x sharding_degree ", d.sharding_degree);
  g.micro_batch_size = b.micro;
  if (!b.global && !b.local) {
    return doc.Error("Global.global_batch_size",
                     "neither global_batch_size nor local_batch_size is set; set one");
  }
  if (b.global && b.local && *b.global != *b.local * written_data_world) {
    return doc.Error("Global.global_batch_size",
                     absl::StrCat(*b.global, " must equal local_batch_size ", *b.local, " x ",
                                  degrees, " = ", *b.local * written_data_world,
                                  " (local_batch_size from ",
                                  doc.SourceOf("Global.local_batch_size"), ")"));
  }
  if (b.global) {
    if (*b.global % written_data_world != 0) {
      return doc.Error("Global.global_batch_size",
                       absl::StrCat(*b.global, " is not a multiple of ", degrees, " = ",
                                    written_data_world));
    }
    g.global_batch_size = *b.global;
  } else {
    g.global_batch_size = *b.local * written_data_world;
  }
  if (fewer_ranks &&
      (g.global_batch_size % data_world != 0 ||
       (g.global_batch_size / data_world) % g.micro_batch_size != 0 ||
       (accumulate && FromOverride(doc, "Engine.accumulate_steps")))) {
    return doc.Error(
        "Distributed.dp_degree",
        absl::StrCat(*dp, " x ", inner_text, " = ", *dp * inner, " ranks, but the job has ",
                     world_size, ", and the global batch ", g.global_batch_size,
                     " cannot be kept on them; give ",
                     OverridesFor(world_size, d, b, g.global_batch_size, accumulate.has_value())));
  }
  g.local_batch_size = g.global_batch_size / data_world;
  if (g.local_batch_size % g.micro_batch_size != 0) {
    return doc.Error(
        "Global.micro_batch_size",
        absl::StrCat(g.micro_batch_size, " does not divide local_batch_size ", g.local_batch_size));
  }
  c->engine.accumulate_steps = g.local_batch_size / g.micro_batch_size;
  if (fewer_ranks) {
    c->notes.push_back(absl::StrCat(
        "Distributed.dp_degree: the config is written for ", *dp * inner, " ranks (dp_degree ",
        *dp, ", from ", doc.SourceOf("Distributed.dp_degree"), ") and the job has ", world_size,
        ": running dp_degree ", d.dp_degree, " with the global batch ", g.global_batch_size,
        " kept by gradient accumulation (local_batch_size ", g.local_batch_size, " = ",
        c->engine.accumulate_steps, " micro-batches of ", g.micro_batch_size, ")"));
  } else if (accumulate && *accumulate != c->engine.accumulate_steps) {
    return doc.Error("Engine.accumulate_steps",
                     absl::StrCat(*accumulate, " must equal local_batch_size / micro_batch_size = ",
                                  c->engine.accumulate_steps, " (or be left empty)"));
  }
  return Status::OK();
}

// Model.vocab_size_divisible_unit (FleetX's vocab_size_with_padding): the
// vocabulary rounded up to a multiple of unit x mp_degree.
void PadVocabulary(int64_t unit, GptJobConfig* c) {
  const int64_t multiple = unit * c->distributed.mp_degree;
  const int64_t padded = (c->model.vocab_size + multiple - 1) / multiple * multiple;
  if (padded == c->model.vocab_size) return;
  c->notes.push_back(absl::StrCat("Model.vocab_size: ", c->model.vocab_size, " padded to ", padded,
                                  " (a multiple of vocab_size_divisible_unit ", unit,
                                  " x mp_degree ", c->distributed.mp_degree, ", as FleetX does)"));
  c->model.vocab_size = static_cast<int>(padded);
}

// Pipeline parallelism's limits (collective/gpt_pipeline.h).
Status CheckPipeline(const ConfigDocument& doc, const GptJobConfig& c) {
  const DistributedConfig& d = c.distributed;
  if (d.pp_degree == 1) return Status::OK();
  if (c.model.num_layers % d.pp_degree != 0) {
    return doc.Error("Distributed.pp_degree",
                     absl::StrCat(d.pp_degree, " does not divide Model.num_layers ",
                                  c.model.num_layers, " (each stage runs as many blocks)"));
  }
  if (d.sharding_degree > 1 && d.sharding_stage > 1) {
    return doc.Error("Distributed.sharding.sharding_stage",
                     absl::StrCat(d.sharding_stage,
                                  " with pp_degree > 1: a stage's gradients accumulate over the "
                                  "step's micro-batches, so only the optimizer states (stage 1) "
                                  "are sharded; set sharding_stage 1"));
  }
  if (d.sharding_offload) {
    return doc.Error("Distributed.sharding.sharding_offload",
                     "true with pp_degree > 1: a stage holds only its own layers' state; set it "
                     "false");
  }
  if (c.model.lora.enabled()) {
    return doc.Error("Distributed.pp_degree",
                     absl::StrCat(d.pp_degree,
                                  " with Model.lora: LoRA trains with data "
                                  "parallelism only; set pp_degree 1"));
  }
  return Status::OK();
}

// Checks that need more than one section.
Status CheckAcross(const ConfigDocument& doc, const GptJobConfig& c) {
  const bool finetune = c.engine.mode == EngineMode::kFinetune;
  if (finetune && c.engine.init_from.empty()) {
    return doc.Error("Engine.init_from",
                     "Engine.mode finetune needs the pretrained model to start from (a FleetPS "
                     "checkpoint directory or a Hugging Face GPT-2 directory)");
  }
  if (finetune && c.data.train.dataset.kind != DatasetKind::kPromptResponse) {
    return doc.Error("Data.Train.dataset.name",
                     "Engine.mode finetune trains on PromptResponseDataset (JSONL prompt/response "
                     "pairs)");
  }
  if (c.model.lora.enabled()) {
    const DistributedConfig& d = c.distributed;
    if (c.engine.init_from.empty()) {
      return doc.Error("Model.lora",
                       "LoRA adapts a pretrained model, whose weights stay frozen: set "
                       "Engine.init_from (a FleetPS checkpoint or a Hugging Face GPT-2 directory)");
    }
    if (d.mp_degree > 1) {
      return doc.Error("Distributed.mp_degree",
                       absl::StrCat(d.mp_degree, " with Model.lora: LoRA trains with data "
                                                 "parallelism (and sharding stages 1-2) only; "
                                                 "set mp_degree 1"));
    }
    if (d.sharding_degree > 1 && d.sharding_stage == 3) {
      return doc.Error("Distributed.sharding.sharding_stage",
                       "3 with Model.lora: the frozen base weights are not sharded; use stage 1 "
                       "or 2 (the adapters' state is small) or no sharding");
    }
    if (d.sharding_offload) {
      return doc.Error("Distributed.sharding.sharding_offload",
                       "true with Model.lora: the adapters' optimizer state is small enough to "
                       "stay on the device; set it false");
    }
  }
  FLEET_RETURN_IF_ERROR(CheckPipeline(doc, c));
  const struct {
    const char* name;
    const DataSplitConfig* split;
  } splits[] = {{"Train", &c.data.train}, {"Eval", &c.data.eval}, {"Test", &c.data.test}};
  for (const auto& s : splits) {
    if (!s.split->present) continue;
    const DatasetConfig& ds = s.split->dataset;
    const std::string prefix = absl::StrCat("Data.", s.name, ".dataset.");
    if (!finetune && ds.kind == DatasetKind::kPromptResponse) {
      return doc.Error(prefix + "name", "PromptResponseDataset needs Engine.mode: finetune");
    }
    if (ds.max_seq_len > c.model.max_position_embeddings) {
      return doc.Error(prefix + "max_seq_len",
                       absl::StrCat(ds.max_seq_len, " exceeds Model.max_position_embeddings ",
                                    c.model.max_position_embeddings));
    }
    const int64_t needed = ds.tokenizer == "byte" ? 257 : 50257;
    if (c.model.vocab_size < needed) {
      return doc.Error("Model.vocab_size",
                       absl::StrCat(c.model.vocab_size, " is below the ", needed, " ids of the ",
                                    ds.tokenizer, " tokenizer (", prefix, "tokenizer)"));
    }
  }
  return Status::OK();
}

}  // namespace

Result<GptJobConfig> ParseGptJobConfig(ConfigDocument document, int64_t world_size) {
  if (world_size < 0) return Status::InvalidArgument("world size must be >= 0");
  GptJobConfig c;
  c.document = std::move(document);
  const ConfigDocument& doc = c.document;
  ConfigSection top(doc, "");
  Batch batch;
  std::optional<int64_t> accumulate, test_iters, dp;
  FLEET_RETURN_IF_ERROR(ParseGlobal(top.Sub("Global"), &c.global, &batch));
  c.model.seed = static_cast<uint64_t>(c.global.seed);
  FLEET_RETURN_IF_ERROR(ParseEngine(top.Sub("Engine"), &c.engine, &accumulate, &test_iters));
  std::optional<int64_t> vocab_unit;
  bool use_increments = false;
  FLEET_RETURN_IF_ERROR(ParseModel(top.Sub("Model"), &c.model, &vocab_unit));
  FLEET_RETURN_IF_ERROR(ParseData(top.Sub("Data"), &c.data));
  FLEET_RETURN_IF_ERROR(ParseOptimizer(top.Sub("Optimizer"), &c.optimizer, &c.lr, &use_increments));
  FLEET_RETURN_IF_ERROR(ParseDistributed(top.Sub("Distributed"), &c.distributed, &dp));
  FLEET_RETURN_IF_ERROR(ParseGeneration(top.Sub("Generation"), &c.generation));
  FLEET_RETURN_IF_ERROR(ParseProfiler(top.Sub("Profiler")));
  FLEET_RETURN_IF_ERROR(ParseFused(top.Sub("Fused")));
  // gpt_serve's section (chat template), read and checked by serve/.
  top.Accept("Serving");
  FLEET_RETURN_IF_ERROR(top.Finish());
  c.engine.test_iters = test_iters.value_or(c.engine.eval_iters * 10);
  FLEET_RETURN_IF_ERROR(Resolve(doc, world_size, dp, batch, accumulate, &c));
  if (vocab_unit) PadVocabulary(*vocab_unit, &c);
  // FleetX's scheduler advances by the global batch a step with
  // use_increments: its warmup and decay_steps count samples.
  if (use_increments) c.lr.step_increment = c.global.global_batch_size;
  FLEET_RETURN_IF_ERROR(CheckAcross(doc, c));
  return c;
}

Result<GptJobConfig> LoadGptJobConfig(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      int64_t world_size) {
  FLEET_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::Load(path));
  for (const auto& o : overrides) FLEET_RETURN_IF_ERROR(doc.Override(o).WithContext(path));
  return ParseGptJobConfig(std::move(doc), world_size);
}

}  // namespace fleet::trainer::config
