"""Retrieval: sentence encoders, FAISS indexes with an on-disk cache, knowledge and case retrievers."""
