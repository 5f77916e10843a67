"""Gaussian algebra: Cholesky and solves, conditionals, KL divergences and expectations."""
