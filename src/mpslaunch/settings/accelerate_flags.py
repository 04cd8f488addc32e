"""Accelerate's launch options that mpslaunch does not take, each refused with the mpslaunch way
(WAYS, which the translation of Accelerate's config files also gives).

They are not argparse options: the launch parser leaves them unknown, and its usage error asks
`refusal` about each unknown word, so typing one gives one line that says what to do, not
"unrecognized arguments", and a launch without them never builds this table. The list follows
`accelerate launch --help` (accelerate 1.15); a test checks that every option there is either
taken by `mpslaunch launch` or listed here.
"""

from __future__ import annotations

# What mpslaunch does not do, and what to do instead (also what the config translation says
# for the same settings, accelerate_config.py).
_PLUGIN = (
    "mpslaunch starts plain data-parallel processes; give Accelerator() its {what} in the "
    "script ({how}), or run it with `accelerate launch`"
)
WAYS = {
    "DeepSpeed": _PLUGIN.format(
        what="DeepSpeed plugin", how="Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))"
    ),
    "FSDP": _PLUGIN.format(
        what="FSDP plugin", how="Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))"
    ),
    "Megatron-LM": _PLUGIN.format(
        what="Megatron-LM plugin", how="Accelerator(megatron_lm_plugin=MegatronLMPlugin(...))"
    ),
    "N-d parallelism": _PLUGIN.format(
        what="parallelism config", how="Accelerator(parallelism_config=ParallelismConfig(...))"
    ),
    "fp8": (
        "mpslaunch's mixed precision is no, fp16 or bf16; for fp8 give Accelerator() "
        "mixed_precision='fp8' and its recipe in the script, on a GPU that has fp8"
    ),
    "TPUs": "mpslaunch runs on mps, cuda or cpu; use `accelerate launch` on a TPU machine",
    "SageMaker": (
        "mpslaunch runs on this machine (and others you name with --num_machines); use "
        "`accelerate launch` for Amazon SageMaker"
    ),
    "MPI": (
        "several CPU processes run through torch.distributed.run: use --cpu --num_processes N, "
        "and --num_machines, --machine_rank, --main_process_ip for several machines"
    ),
    "CPU affinity": (
        "mpslaunch does not pin processes to cores; size each process with "
        "--num_cpu_threads_per_process N, or start mpslaunch under numactl or taskset"
    ),
    "other accelerators": "mpslaunch runs on mps, cuda or cpu; use `accelerate launch` for this device",
}

# (the mpslaunch way, the options it answers; each also in its dash spelling)
REFUSED = (
    (
        WAYS["DeepSpeed"],
        (
            "--use_deepspeed",
            "--deepspeed_config_file",
            "--zero_stage",
            "--offload_optimizer_device",
            "--offload_param_device",
            "--offload_optimizer_nvme_path",
            "--offload_param_nvme_path",
            "--zero3_init_flag",
            "--zero3_save_16bit_model",
            "--deepspeed_hostfile",
            "--deepspeed_exclusion_filter",
            "--deepspeed_inclusion_filter",
            "--deepspeed_multinode_launcher",
            "--deepspeed_moe_layer_cls_names",
        ),
    ),
    (
        "set it in the script: Accelerator(gradient_accumulation_steps=N), or "
        "accelerator.clip_grad_norm_(parameters, max_norm)",
        ("--gradient_accumulation_steps", "--gradient_clipping"),
    ),
    (
        WAYS["FSDP"],
        (
            "--use_fsdp",
            "--fsdp_version",
            "--fsdp_offload_params",
            "--fsdp_min_num_params",
            "--fsdp_sharding_strategy",
            "--fsdp_reshard_after_forward",
            "--fsdp_auto_wrap_policy",
            "--fsdp_transformer_layer_cls_to_wrap",
            "--fsdp_backward_prefetch",
            "--fsdp_state_dict_type",
            "--fsdp_forward_prefetch",
            "--fsdp_use_orig_params",
            "--fsdp_cpu_ram_efficient_loading",
            "--fsdp_sync_module_states",
            "--fsdp_activation_checkpointing",
            "--fsdp_activation_checkpointing_offload",
        ),
    ),
    (
        WAYS["Megatron-LM"],
        (
            "--use_megatron_lm",
            "--megatron_lm_tp_degree",
            "--megatron_lm_use_custom_fsdp",
            "--megatron_lm_no_load_optim",
            "--megatron_lm_eod_mask_loss",
            "--megatron_lm_overlap_cpu_optimizer_d2h_h2d",
            "--megatron_lm_no_save_optim",
            "--megatron_lm_optimizer_cpu_offload",
            "--megatron_lm_use_precision_aware_optimizer",
            "--megatron_lm_decoder_last_pipeline_num_layers",
            "--megatron_lm_pp_degree",
            "--megatron_lm_num_micro_batches",
            "--megatron_lm_sequence_parallelism",
            "--megatron_lm_recompute_activations",
            "--megatron_lm_use_distributed_optimizer",
            "--megatron_lm_gradient_clipping",
            "--megatron_lm_recompute_granularity",
            "--megatron_lm_recompute_method",
            "--megatron_lm_recompute_num_layers",
            "--megatron_lm_attention_backend",
            "--megatron_lm_expert_model_parallel_size",
            "--megatron_lm_context_parallel_size",
            "--megatron_lm_attention_dropout",
            "--megatron_lm_hidden_dropout",
            "--megatron_lm_attention_softmax_in_fp32",
            "--megatron_lm_expert_tensor_parallel_size",
            "--megatron_lm_calculate_per_token_loss",
            "--megatron_lm_use_rotary_position_embeddings",
        ),
    ),
    (
        WAYS["N-d parallelism"],
        (
            "--use_parallelism_config",
            "--parallelism_config_dp_replicate_size",
            "--parallelism_config_dp_shard_size",
            "--parallelism_config_tp_size",
            "--parallelism_config_cp_size",
            "--parallelism_config_cp_backend",
            "--parallelism_config_cp_comm_strategy",
            "--parallelism_config_sp_size",
            "--parallelism_config_sp_backend",
            "--parallelism_config_sp_seq_length",
            "--parallelism_config_sp_seq_length_is_variable",
            "--parallelism_config_sp_attn_implementation",
        ),
    ),
    (
        WAYS["fp8"],
        (
            "--fp8_use_autocast_during_eval",
            "--fp8_backend",
            "--fp8_margin",
            "--fp8_interval",
            "--fp8_format",
            "--fp8_amax_history_len",
            "--fp8_amax_compute_algo",
            "--fp8_override_linear_precision",
            "--fp8_opt_level",
            "--fp8_enable_fsdp_float8_all_gather",
            "--fp8_pad_inner_dim",
        ),
    ),
    (
        WAYS["TPUs"],
        (
            "--tpu",
            "--tpu_cluster",
            "--no_tpu_cluster",
            "--tpu_use_sudo",
            "--downcast_bf16",
            "--vm",
            "--env",
            "--main_training_function",
        ),
    ),
    (WAYS["SageMaker"], ("--aws_access_key_id", "--aws_secret_access_key")),
    (WAYS["MPI"], ("--mpirun_hostfile",)),
    (WAYS["CPU affinity"], ("--enable_cpu_affinity",)),
    (
        "--rdzv_backend static (the default) meets at --main_process_ip and "
        "--main_process_port, as --same_network does; drop it",
        ("--same_network",),
    ),
    (
        "mpslaunch builds the rendezvous from --rdzv_backend, --main_process_ip and "
        "--main_process_port; drop --rdzv_conf",
        ("--rdzv_conf",),
    ),
    ("mpslaunch names its workers itself; drop --role", ("--role",)),
)


def refusal(word: str) -> str | None:
    """The one-line refusal of `word` (`--name`, `--name=value`, or its dash spelling) when it is
    an Accelerate launch option listed here, else None."""
    from mpslaunch.settings.flags import spellings  # imported by the launch parser already

    typed = word.split("=", 1)[0]
    for why, names in REFUSED:
        if any(typed in spellings(name) for name in names):
            return f"{typed} is an accelerate launch option mpslaunch does not take: {why}"
    return None
