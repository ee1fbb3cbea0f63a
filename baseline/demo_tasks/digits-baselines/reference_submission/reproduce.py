"""Reference replication of the demo paper "Small Models, Solid Digits" (CPU, a few seconds)."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, confusion_matrix
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

SEED = 0
FRACTIONS = (0.10, 0.25, 0.50, 1.00)


def logistic_regression() -> LogisticRegression:
    return LogisticRegression(C=1.0, solver="lbfgs", max_iter=2000)


def models() -> dict[str, Pipeline]:
    return {
        "lr": make_pipeline(StandardScaler(), logistic_regression()),
        "knn": make_pipeline(StandardScaler(), KNeighborsClassifier(n_neighbors=3)),
        "pca_lr": make_pipeline(
            StandardScaler(), PCA(n_components=20, random_state=SEED), logistic_regression()
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, stratify=y, random_state=SEED
    )
    print(f"train {len(y_train)} images, test {len(y_test)} images")

    metrics: dict[str, object] = {"train_size": len(y_train), "test_size": len(y_test)}
    for name, model in models().items():
        model.fit(x_train, y_train)
        predicted = model.predict(x_test)
        accuracy = float(accuracy_score(y_test, predicted))
        metrics[f"{name}_accuracy"] = accuracy
        print(f"{name}: test accuracy {accuracy:.4f}")
        if name == "lr":
            matrix = confusion_matrix(y_test, predicted)
            np.savetxt(args.out / "confusion_lr.csv", matrix, fmt="%d", delimiter=",")
            errors = matrix.copy()
            np.fill_diagonal(errors, 0)
            true, pred = np.unravel_index(int(errors.argmax()), errors.shape)
            metrics["lr_top_error"] = {
                "true": int(true),
                "predicted": int(pred),
                "count": int(errors[true, pred]),
            }
            print(f"lr most frequent error: true {true} predicted {pred} ({errors[true, pred]}x)")

    with open(args.out / "learning_curve.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["fraction", "train_size", "accuracy"])
        for fraction in FRACTIONS:
            if fraction < 1:
                x_sub, _, y_sub, _ = train_test_split(
                    x_train, y_train, train_size=fraction, stratify=y_train, random_state=SEED
                )
            else:
                x_sub, y_sub = x_train, y_train
            model = make_pipeline(StandardScaler(), logistic_regression()).fit(x_sub, y_sub)
            accuracy = float(accuracy_score(y_test, model.predict(x_test)))
            writer.writerow([fraction, len(y_sub), f"{accuracy:.4f}"])
            print(f"learning curve: {fraction:.0%} ({len(y_sub)} images) -> {accuracy:.4f}")

    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


if __name__ == "__main__":
    main()
