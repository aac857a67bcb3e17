"""The report's sections, one module each, in the order ``document.BODY`` lists them.

Every section module owns its numbers, its claims and its figures and exposes
``build(inputs, unc) -> Section``: its blocks in reading order and the papers'
claims it checks (the headline lists them). Shared pieces live one level up:
``blocks`` (block and table types), ``style`` (the look and drawing helpers),
``formats``, ``stats`` and ``sigma_curves``. Sections import nothing from each
other; a large one is a package (``distributed``, ``landscape``, ``shift``) whose
numbers are in ``measures`` (a module called ``numbers`` would shadow the standard
library's for the deps check's ModuleFinder).
"""
