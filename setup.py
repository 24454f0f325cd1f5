"""legorl_jax: harness-native reinforcement learning for coding agents, in JAX."""

import setuptools

INSTALL_REQUIRES = [
    "jax[cpu]>=0.10.0,<0.11",
    "flax>=0.12.0,<0.13",
    "optax>=0.2.5,<0.3",
    "orbax-checkpoint>=0.12.0,<0.13",
    "ml_collections>=1.0,<2",
    "absl-py>=2.1,<3",
    "numpy>=2.0,<3",
    "transformers>=5.0,<6",
    "tokenizers>=0.22,<0.24",
    "safetensors>=0.5,<0.9",
    # GGUF import (models.gguf): the reader only; dequantization is our own numpy.
    "gguf>=0.19,<0.20",
    "tensorflow-datasets>=4.9.8,<4.10",
    "array_record>=0.7,<0.9",
    "docker>=7.0,<8",
    "jaxtyping>=0.3,<0.4",
    "tqdm>=4.66,<5",
    "aiohttp>=3.9,<4",
    "tensorboardX>=2.6,<3",
    # Run-file paths: local, gs:// (with gcsfs, in [tpu]) and other object stores.
    "etils[epath]>=1.7,<2",
    "fsspec>=2024.2",
]

EXTRAS = {
    "tpu": ["jax[tpu]>=0.10.0,<0.11", "gcsfs>=2024.2"],
    "gpu": ["jax[cuda12]>=0.10.0,<0.11"],
    # Trials on a Ray cluster (rollout.backend="ray"). Core Ray plus the client (grpcio) for
    # ray://HOST:10001 addresses; ray[default] (dashboard, ~20 more packages) is not needed.
    "ray": ["ray[client]>=2.50,<3"],
    "test": [
        "pytest>=8,<10",
        "pytest-timeout>=2.3,<3",
        # Two workers (pytest.ini): the suite's share of waiting on subprocesses, sandboxes and
        # harness CLIs overlaps the other worker's compute on a 2-core CI host.
        "pytest-xdist>=3.6,<4",
        # Reference implementations for parity tests only (CPU wheel).
        "torch==2.13.0",
        # transformers' GGUF loader (the reference of the GGUF import tests) needs it.
        "accelerate>=1.0,<2",
        "openai>=1.80,<4",
        "anthropic>=0.50,<3",
        # Executing the Colab notebooks in tests.
        "nbclient>=0.10,<0.12",
        "nbformat>=5.10,<6",
        "ipykernel>=6.29,<8",
        # The Ray backend's tests start a real multi-node local cluster.
        "ray[client]>=2.50,<3",
    ],
}

setuptools.setup(
    name="legorl_jax",
    version="0.1.0",
    description="Harness-native reinforcement learning for coding agents, in JAX.",
    packages=setuptools.find_packages(include=["legorl_jax", "legorl_jax.*", "experiments", "experiments.*"]),
    package_data={"legorl_jax": ["models/assets/**/*"]},
    include_package_data=True,
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
