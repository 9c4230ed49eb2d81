"""The voice's acoustic frame and decoder shape constants: shared by training (torch) and synthesis
(numpy) without importing torch."""

HOP = 80                   # 10 ms at 8 kHz: one decoder step per frame
WIN = 320                  # 40 ms synthesis window (Hann), overlap-added every HOP
N_BINS = WIN // 2 + 1      # spectrum bins the decoder predicts per frame (magnitude and phase)
DELAY = WIN // 2           # samples the waveform lags its conditioning frame
OLA_GAIN = WIN / HOP / 2   # sum of the overlapping Hann windows
LOG_MAG_MAX = 6.0          # clamp on predicted log magnitude
CONV_TAPS = 4              # the short causal depthwise convolution in each SSM block (as in Mamba)
