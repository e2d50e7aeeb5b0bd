"""Expert types: parameters plus a per-expert function written against a
grouped matmul, so that every dispatch backend can run every expert type."""
from moejax.experts.swiglu import SwiGLUExperts, swiglu_experts
