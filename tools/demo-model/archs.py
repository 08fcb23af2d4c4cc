"""UNet presets of the easel demo model (plain Python, no torch: train.py and random_ckpt.py share them).

Every preset is a diffusers UNet2DConditionModel config (keyword arguments). Heads: diffusers'
`attention_head_dim` is the number of heads (its naming quirk, models/unets/unet_2d_condition.py);
every preset keeps 8 heads per attention, the SD1.x convention that single-file loaders (easel's
src/models/sd/unet_config.cpp, the original ldm config) assume, so no config has to travel with the file.

  v1       runs 1-6 (the shipped model up to run 6): attention at the 32x32 and 16x16 latent levels
           (heads of 4 and 8 channels) and in the mid block; none at 8x8.
  lowattn  run 7: attention moved down to the 16x16 and 8x8 levels (as SDXL keeps its first level
           free of attention): down DownBlock2D, CrossAttnDownBlock2D x2; up CrossAttnUpBlock2D x2,
           UpBlock2D. Heads of 8 (16x16, 64 channels) and 16 channels (8x8 and mid, 128 channels),
           both multiples of 8, so PyTorch's flash / memory-efficient attention kernels take them; no
           1024-token self-attention, so a training step and an easel CPU step are cheaper. 6.22 M
           parameters (v1: 4.55 M), 1.62 GFLOP per evaluation at a 32x32 latent (v1: 2.30); the whole
           f16 file stays under 30 MB (a second transformer layer at 8x8 would not: 8.2 M).
  gn2      run 11: lowattn with 64 channels at the 32x32 level (block_out_channels (64, 64, 128)), so every
           GroupNorm there has 2 channels per group instead of 1. A GroupNorm of one channel per group
           removes that channel's mean over the image (its DC) outright, and the UNet's last norm
           (conv_norm_out, before conv_out) works on the first level's channels: with 32 channels the
           output's per-channel level over the image can only come from the spatial pattern (see VAE_PRESETS).

VAE presets (AutoencoderKL: 4 latent channels, factor 8, 32 norm groups, as SD1.x):
  v1       runs 1-10: block_out_channels (32, 64, 64, 64), 2 resnets per level (3 in the decoder).
  gn3      run 11: (96, 96, 96, 96), 1 resnet per level (2 in the decoder). Why: with 32 channels at the
           full-resolution level, the decoder's conv_norm_out (GroupNorm, 32 groups) has one channel per group,
           which normalises every channel to zero mean and unit variance over the image, so a flat colour cannot
           pass through it; the v1 VAE learnt to make the spatial pattern carry it instead: one latent cell of
           extreme value (10-20 standard deviations; decoding without it raises the L1 from 0.03 to 0.07-0.25) and
           different values along the border. Drawn by the UNet slightly wrong, that cell decodes as the
           multicoloured speck and the border as the faint frame; and the v1 VAE by itself (encode -> decode of
           the procedural pictures) gets the object colour right in only 0.66 of them, the shape in 0.77 (the
           scorer, tools/demo-model/score.py), with edges 5 px wide. With 3 channels per group a flat map keeps
           its direction within each group (one free value per group), so no such trick is needed.
           Decoder 73 GFLOP at 256x256 (v1: 25), 6.5 MB in f16 (v1: 3.5).

Text encoder presets (CLIP text transformer, 3 layers, heads of 64 as SD1.x):
  w128     runs 1-10: width 128 (2 heads), MLP 512: 13.9 MB in f16, 12.6 MB of it the 49408 x 128 token table.
  w64      run 11: width 64 (1 head), MLP 256: 6.6 MB; pays for the gn3 VAE within the 30 MB file (the prompts use
           about 40 of the 49408 tokens). The UNet's cross_attention_dim is the text encoder's width.
"""

V1 = dict(sample_size=32, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(32, 64, 128),
          down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
          up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
          cross_attention_dim=128, attention_head_dim=8, norm_num_groups=32)

LOWATTN = dict(sample_size=32, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(32, 64, 128),
               down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
               up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
               cross_attention_dim=128, attention_head_dim=8, norm_num_groups=32)

GN2 = dict(LOWATTN, block_out_channels=(64, 64, 128))

UNET_PRESETS = {"v1": V1, "lowattn": LOWATTN, "gn2": GN2}

VAE_PRESETS = {"v1": dict(block_out_channels=(32, 64, 64, 64), layers_per_block=2),
               "gn3": dict(block_out_channels=(96, 96, 96, 96), layers_per_block=1)}

TE_PRESETS = {"w128": dict(hidden_size=128, intermediate_size=512, num_attention_heads=2),
              "w64": dict(hidden_size=64, intermediate_size=256, num_attention_heads=1)}
