//! Transformer model library: loading, operator variants, f32 forward, fixed-point simulator.
