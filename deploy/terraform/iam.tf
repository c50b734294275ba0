# Two roles, as ECS splits them. The execution role is the agent's: it pulls the image, writes
# the awslogs stream and reads the token secret into TRAINYARD_TOKEN. The task role is trainyard's
# own: ECS serves its temporary credentials at AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, which
# trainyard's S3 storage reads (storage/aws_credentials), so no static keys are in the tasks.

locals {
  task_role_name      = "${var.name}-task"
  execution_role_name = "${var.name}-execution"
  bucket_arn          = "arn:${data.aws_partition.current.partition}:s3:::${var.checkpoint_bucket}"
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

resource "aws_iam_role" "execution" {
  name               = local.execution_role_name
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "ClusterToken"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.token_secret_arn]
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "token-secret"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

resource "aws_iam_role" "task" {
  name               = local.task_role_name
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "task" {
  statement {
    sid       = "ListCheckpoints"
    actions   = ["s3:ListBucket", "s3:GetBucketLocation"]
    resources = [local.bucket_arn]
    dynamic "condition" {
      for_each = var.checkpoint_prefix == "" ? [] : [var.checkpoint_prefix]
      content {
        test     = "StringLike"
        variable = "s3:prefix"
        values   = ["${condition.value}*"]
      }
    }
  }
  statement {
    sid = "ReadWriteCheckpoints"
    # Multipart uploads for large shards; DeleteObject for checkpoints past keep-last.
    actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts"]
    resources = ["${local.bucket_arn}/${var.checkpoint_prefix}*"]
  }
  dynamic "statement" {
    for_each = var.enable_execute_command ? [1] : []
    content {
      sid = "ExecuteCommand"
      actions = ["ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"]
      resources = ["*"]
    }
  }
}

resource "aws_iam_role_policy" "task" {
  name   = "checkpoints"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json
}
