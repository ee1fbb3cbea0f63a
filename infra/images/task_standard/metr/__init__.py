"""METR's ``metr`` package, as Task Standard families import it (``metr.task_protected_scoring``);
installed into every family image by `infra.image_build`."""
