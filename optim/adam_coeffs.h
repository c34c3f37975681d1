// The per-group scalars of an Adam-family step, shared by Adam/AdamW and LAMB.
#pragma once

#include "optim/element_math.h"
#include "optim/optimizer.h"

namespace zero::optim {

// Bias corrections and step size in double, rounded to fp32 where torch.optim.Adam rounds its Python floats.
AdamCoeffs adam_coeffs(double beta1, double beta2, double eps, bool decoupled, const ShardStep& step,
                       const ParamGroup& group);

}  // namespace zero::optim
