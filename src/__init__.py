"""conditioned-attention: does this attention variant train better than softmax attention?"""
