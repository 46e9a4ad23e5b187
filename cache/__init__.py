"""Encoder-output cache and preprocessed-feature cache."""

from cache.encoder_cache import EncoderCacheManager
from cache.feature_cache import FeatureCache

__all__ = ["EncoderCacheManager", "FeatureCache"]
