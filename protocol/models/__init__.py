"""Model formats every role reads or writes, apart from the network.

The families we train and what differs between them (``families``), a
policy version as a GGUF file for llama.cpp (``gguf_export``) and a LoRA
adapter as a GGUF adapter (``gguf_lora``), versions shipped as updates
against a base (``updates``) and what an update may declare before anything
is allocated for it (``update_limits``), a safetensors header read from a
stranger's bytes (``safetensors_header``), GPT-2's byte alphabet
(``bytevocab``).

May import the language (the modules directly under ``protocol``) and
``protocol.process``; not ``net``, ``wire`` or ``broadcast``. torch is
imported only inside the functions that need it, so that tools without
torch can read every format.
"""
