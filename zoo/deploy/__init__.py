"""The deploy forms of a model: BatchNorm folded (`fuse`), INT8 (`quantization`) and the exported programs
(`export`)."""
