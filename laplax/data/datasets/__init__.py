"""One module per image data set: a TFDS builder that prepares it from LOCAL files (no
TensorFlow, no downloads), its constants and ImageDatasetInfo entries, and `builder(source_dir,
tfds_dir)`. laplax.data.builders holds the registry by data set name and the cached loading
(`load_split`, `dataset_info`).

  fashion_mnist  FashionMnistLocal ('fashion_mnist_local'): the four official IDX `.gz` files
  cifar10        Cifar10Local ('cifar10_local'): the JPEG zip or the official binary archive
  cifar100       Cifar100Local ('cifar100_local'): the official binary archive, fine and coarse
                 labels
  ade20k         the ADEChallengeData2016 folder's layout (segmentation; read per record by
                 laplax.data.ade20k_stream, no builder)
  common         DataError, ImageDatasetInfo, PNG encoding, binary CIFAR records

All are `tfds.core.GeneratorBasedBuilder`s written as `array_record` (random access, read with
`tfds.data_source`). They take the source path in their constructor and keep the source order
(`disable_shuffling`), so record i is the i-th image of the official files.
"""
