"""Reference solution: an RBF support-vector machine (the normalised score's 1.0)."""

from __future__ import annotations

import numpy as np
from sklearn.svm import SVC


def train_and_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    model = SVC(C=10.0, gamma=0.001)
    model.fit(x_train, y_train)
    return model.predict(x_test)
