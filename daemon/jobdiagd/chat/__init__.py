"""Chat presentation shared by the Telegram and Slack transports: pictures, rendering, command routing."""
