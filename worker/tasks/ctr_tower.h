// The dense part of a job's CTR model (CtrModel), as both its halves build
// it: the CPU worker's CTR task (worker/tasks/ctr_task.cc) and the heter
// worker's dense section (heter/dense_section.h).
#pragma once

#include "comm/status.h"
#include "ps/job_config.h"
#include "trainer/models/ctr_model.h"
#include "worker/config.h"

namespace fleet::worker {

// The model's config: the parts model.kind turns on (ctr_dnn is dnn), 26
// pooled slots of the sparse table's pull width (`dim` with the plain
// accessor, embed_dim + dim with the CTR one), 13 dense features,
// model.hidden, model.cross_layers, model.seed. InvalidArgument naming
// model.kind when it is not a CTR model, or model.sparse_table when it
// names no sparse table of `job`.
Result<trainer::CtrModelConfig> CtrTowerConfig(const WorkerConfig& config,
                                               const ps::JobConfig& job);

}  // namespace fleet::worker
