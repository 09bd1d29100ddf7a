// Programmatic dependent launches (see pdl_launch.cuh), host side: whether kernel launches
// carry the attribute. Plain C++ so that host code can query (and initialise) it early.
#pragma once

namespace arbor::kernels {

// A GPU of compute capability 9 or later, device code built for sm_90 or later (a one-thread
// probe kernel checks), and not turned off by set_pdl_allowed(false). The probe runs once per
// process, at the first call, which must not be inside a stream capture (it allocates and
// copies).
bool pdl_enabled();

// Whether launches may carry the attribute at all (default true; CudaBackendOptions::pdl).
// Call before the first kernel launch of the process: graphs captured earlier keep theirs.
void set_pdl_allowed(bool allowed);

}  // namespace arbor::kernels
