// The CTR-DNN tower of a job, as both its halves build it: the CPU worker's
// ctr_dnn task (worker/tasks/ctr_dnn_task.cc) and the heter worker's dense
// section (heter/dense_section.h).
#pragma once

#include "comm/status.h"
#include "ps/job_config.h"
#include "trainer/models/ctr_dnn.h"
#include "worker/config.h"

namespace fleet::worker {

// The tower's config: 26 pooled slots of the sparse table's pull width
// (`dim` with the plain accessor, embed_dim + dim with the CTR one), 13 dense
// features, model.hidden, model.seed. InvalidArgument naming
// model.sparse_table when it names no sparse table of `job`.
Result<trainer::CtrDnnConfig> CtrDnnTowerConfig(const WorkerConfig& config,
                                                const ps::JobConfig& job);

}  // namespace fleet::worker
