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
"""

V1 = dict(sample_size=32, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(32, 64, 128),
          down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
          up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
          cross_attention_dim=128, attention_head_dim=8, norm_num_groups=32)

LOWATTN = dict(sample_size=32, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(32, 64, 128),
               down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
               up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
               cross_attention_dim=128, attention_head_dim=8, norm_num_groups=32)

UNET_PRESETS = {"v1": V1, "lowattn": LOWATTN}
