"""Your own networks for ``model.factory: networks.<module>:<function>``.

Every pipeline stage that builds the model depends on this folder (``model.code``), so
editing a file here reruns them. A factory is called as ``function(input_shape,
num_classes, **model.options)`` and returns an ``nn.Module`` giving ``num_classes``
logits; ``example.py`` is one.
"""
