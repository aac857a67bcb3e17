"""The one training loop (``train``) and what it runs on: the split on the device and its
batches (``batches``), optimizers (``optim``, ``sam``), precision and layout
(``precision``), on-device augmentation (``augment``), BatchNorm statistics
(``batchnorm``), the flat parameter vector (``flat``), CPU-independent elementwise maths
(``ieee``) and the data-parallel world (``distributed``). Every stage that trains or
predicts imports all of it, so DVC tracks it as one folder."""
